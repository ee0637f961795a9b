"""The weights iterator's read-ahead across batches (``shardpoint.torch.read_ahead``): it hints
at most ``ahead`` bytes beyond the batch being read, stops and closes its files when the
iterator ends, is closed or dropped, and the values read with it are the file's, bit for bit.
"""

from __future__ import annotations

import gc
import os
import pathlib
import threading
import time

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import shardpoint.torch as sptorch  # noqa: E402
from shardpoint.torch import weights as weights_mod  # noqa: E402
from shardpoint.torch.read_ahead import PIECE, ReadAhead, pieces  # noqa: E402

MiB = 1 << 20


def _open_under(root: str | os.PathLike[str]) -> list[str]:
    """The files under ``root`` this process holds open. Why not a before/after set of all
    descriptors: in the full suite other threads and the collector close descriptors at any
    moment, and a number closed meanwhile can be the one a hint opens (seen in CI's layout:
    "assert 0 == 1")."""
    prefix = os.path.join(os.fspath(root), "")
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while listed
            continue
        if target.startswith(prefix):
            out.append(target)
    return sorted(out)


def _ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardpoint-ahead"]


def _wait_for(cond, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_pieces_merge_adjacent_spans_and_cut_them() -> None:
    spans = [(0, 0, 3 * MiB), (0, 3 * MiB, 6 * MiB), (1, 0, 10), (0, 20 * MiB, 1), (0, 5, 0)]
    assert pieces(spans) == [
        (0, 0, PIECE),  # 9 MiB of file 0, merged, then cut at 8 MiB
        (0, PIECE, 9 * MiB - PIECE),
        (1, 0, 10),
        (0, 20 * MiB, 1),  # not adjacent: a hint of its own; the empty span is dropped
    ]


def test_hints_stay_within_ahead_of_the_reads_and_close_frees(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "f"
    with open(f, "wb") as fh:
        fh.truncate(64 * MiB)  # sparse: hints cost nothing
    assert _open_under(tmp_path) == []
    ra = ReadAhead([str(f)], [(0, 0, 64 * MiB)], ahead=16 * MiB)
    # hints are issued while they start within `ahead` of the reads: 0, 8 and 16 MiB
    assert _wait_for(lambda: ra.hinted == 24 * MiB)
    time.sleep(0.05)
    assert ra.hinted == 24 * MiB  # and no further, until the reads move on
    ra.advance(40 * MiB)
    assert _wait_for(lambda: ra.hinted == 64 * MiB)
    ra.close()
    assert not ra._thread.is_alive()
    assert _open_under(tmp_path) == []


def test_close_stops_a_waiting_read_ahead(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "f"
    with open(f, "wb") as fh:
        fh.truncate(64 * MiB)
    ra = ReadAhead([str(f)], [(0, 0, 64 * MiB)], ahead=0)
    assert _wait_for(lambda: ra.hinted == PIECE)
    ra.close()  # the thread waits for reads that never come: close wakes and ends it
    assert not ra._thread.is_alive() and ra.hinted == PIECE
    assert _open_under(tmp_path) == []


def test_one_file_open_at_a_time(tmp_path: pathlib.Path) -> None:
    # a checkpoint may have thousands of shards: the read-ahead holds only the file it hints
    paths = []
    for i in range(40):
        f = tmp_path / f"shard-{i:02d}"
        with open(f, "wb") as fh:
            fh.truncate(MiB)
        paths.append(str(f))
    ra = ReadAhead(paths, [(i, 0, MiB) for i in range(40)], ahead=2 * MiB)
    try:
        assert _wait_for(lambda: ra.hinted == 3 * MiB)  # waits for the reads, a file open
        assert _open_under(tmp_path) == [paths[2]]
        ra.advance(40 * MiB)
        assert _wait_for(lambda: ra.hinted == 40 * MiB)
        assert _wait_for(lambda: not ra._thread.is_alive())  # done: its last file closed
        assert _open_under(tmp_path) == []
    finally:
        ra.close()
    assert _open_under(tmp_path) == []


def test_a_file_it_cannot_open_only_loses_the_hints(tmp_path: pathlib.Path) -> None:
    ra = ReadAhead([str(tmp_path / "absent")], [(0, 0, MiB)], ahead=MiB)
    ra.close()
    assert ra.hinted == 0 and _open_under(tmp_path) == []


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(41)
    # 48 values of 0.75-1.5 MiB and small ones between: several batches, pooled and not
    state: dict[str, torch.Tensor] = {}
    for i in range(48):
        rows = 384 + 128 * (i % 4)
        state[f"layers.{i:02d}.w"] = torch.randn(rows, 1024, generator=g).to(torch.bfloat16)
        state[f"layers.{i:02d}.b"] = torch.randn(1024, generator=g)
    d = tmp_path_factory.mktemp("hf")
    safetensors_torch.save_file(state, str(d / "model.safetensors"))
    return str(d), state


def test_values_bit_for_bit_and_the_read_ahead_ends_with_the_iteration(
    hf_dir: tuple[str, dict[str, torch.Tensor]],
) -> None:
    path, state = hf_dir
    it = sptorch.weights_iterator(path, io="pread", window=8 * MiB)
    peak = 0
    got = {}
    for name, t in it:
        peak = max(peak, it._inflight)
        got[name] = t
    assert set(got) == set(state)
    for k, v in state.items():
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    assert 0 < peak <= 8 * MiB  # the window still bounds what is read ahead
    assert not _ahead_threads() and _open_under(path) == []


def test_close_and_break_stop_the_read_ahead(hf_dir: tuple[str, dict[str, torch.Tensor]]) -> None:
    path, state = hf_dir
    it = sptorch.weights_iterator(path, io="pread", window=4 * MiB)
    name, t = next(it)
    assert it._p._ahead is not None  # a Hugging Face file is read ahead across batches
    it.close()
    assert not _ahead_threads() and _open_under(path) == []
    assert torch.equal(t.view(torch.uint8), state[name].view(torch.uint8))
    for _name, _t in sptorch.weights_iterator(path, io="pread", window=4 * MiB):
        break  # the dropped iterator closes itself, read-ahead included
    gc.collect()
    assert _wait_for(lambda: not _ahead_threads()) and _open_under(path) == []


def test_small_batches_where_read_ahead_runs(
    hf_dir: tuple[str, dict[str, torch.Tensor]], tmp_path: pathlib.Path
) -> None:
    path, state = hf_dir
    sptorch.save(state, str(tmp_path / "ck"), compression="zstd")
    sizes: list[int] = []
    orig = weights_mod._Producer._read_batch

    def spy(self, batch):  # type: ignore[no-untyped-def]
        sizes.append(sum(i.raw_bytes for i in batch))
        return orig(self, batch)

    def run(src: str, **kw: object) -> tuple[list[int], bool]:
        sizes.clear()
        it = sptorch.weights_iterator(src, io="pread", **kw)  # type: ignore[arg-type]
        got = dict(it)
        assert set(got) == set(state)
        for k, v in state.items():
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), (src, k)
        return list(sizes), it._p._ahead is not None

    weights_mod._Producer._read_batch = spy  # type: ignore[method-assign]
    try:
        hf_sizes, hf_ahead = run(path)
        sp_sizes, sp_ahead = run(str(tmp_path / "ck"))  # entries' shards and offsets hinted
        direct_sizes, direct_ahead = run(path, direct=True)  # its own engine: no hints
    finally:
        weights_mod._Producer._read_batch = orig  # type: ignore[method-assign]
    small = weights_mod._AHEAD_BATCH
    assert hf_ahead and sp_ahead and not direct_ahead
    assert max(hf_sizes) <= small and len(hf_sizes) >= 4
    assert max(sp_sizes) <= small and len(sp_sizes) >= 4
    assert max(direct_sizes) > small  # batches grow to _BATCH there


def test_a_file_that_shrinks_under_the_read_ahead(tmp_path: pathlib.Path) -> None:
    """Hints past a file's new end are no error (they only hint): the thread walks on to the
    end of its spans, and closes its file."""
    f = tmp_path / "f"
    with open(f, "wb") as fh:
        fh.truncate(64 * MiB)
    ra = ReadAhead([str(f)], [(0, 0, 64 * MiB)], ahead=8 * MiB)
    assert _wait_for(lambda: ra.hinted == 16 * MiB)
    os.truncate(f, MiB)
    ra.advance(64 * MiB)
    assert _wait_for(lambda: ra.hinted == 64 * MiB)
    assert _wait_for(lambda: not ra._thread.is_alive())
    ra.close()
    assert _open_under(tmp_path) == []


def test_iterating_a_file_that_shrinks_is_an_error_naming_it(
    hf_dir: tuple[str, dict[str, torch.Tensor]], tmp_path: pathlib.Path
) -> None:
    """The iterator's own reads find the shortened file (the read-ahead only hinted): a
    CorruptCheckpointError naming the file, the first key no longer whole and the cause, and
    the read-ahead thread and its file are gone after, as after any iteration."""
    import shutil

    import shardpoint as sp

    path, _ = hf_dir
    d = tmp_path / "copy"
    shutil.copytree(path, d)
    f = d / "model.safetensors"
    it = sptorch.weights_iterator(str(d), io="pread", window=4 * MiB)
    next(it)
    os.truncate(f, os.path.getsize(f) // 2)
    with pytest.raises(sp.CorruptCheckpointError, match=r"key '.+': file is now \d+ bytes") as e:
        for _ in it:
            pass
    assert str(f) in str(e.value)
    assert "truncated or rewritten in place after open" in str(e.value)
    it.close()
    assert _wait_for(lambda: not _ahead_threads()) and _open_under(d) == []
