"""``sptorch.weights_iterator``: the engine-neutral iterator every serving route builds on.

Checked against ``safetensors.safe_open`` bit for bit (vLLM's own pattern for a new weights
iterator), on odd dtypes and shapes and tied names, over every format it reads: Hugging Face
directories and single files, shardpoint checkpoints (compressed and not) and single-file
checkpoints. Also: tensors own their memory and outlive the iterator (vLLM's runai test), a
damaged byte names its key, the read-ahead window bounds what is held, and ``io="pread"``
never maps a file (``/proc/self/maps``)."""

from __future__ import annotations

import gc
import mmap
import os
import pathlib

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.storage import read_ranges_direct

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
hub = pytest.importorskip("huggingface_hub")

import shardpoint.torch as sptorch  # noqa: E402
from page_cache import evict, takes_o_direct  # noqa: E402
from shardpoint.convert import convert  # noqa: E402


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(34)
    base = torch.randn(64, 48, generator=g)
    embed = torch.randn(40, 16, generator=g).to(torch.bfloat16)
    return {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,  # tied: stored once by the hub's writer
        "model.layers.0.q.weight": base.to(torch.bfloat16),
        "model.layers.0.k.weight": base.t().contiguous().to(torch.float16),  # from a transposed
        "model.layers.0.norm.weight": torch.randn(3, 5, 7, generator=g),
        "model.scalar": torch.tensor(3.5, dtype=torch.float64),
        "model.empty": torch.empty(0, 3, dtype=torch.bfloat16),
        "model.one": torch.ones(1, dtype=torch.float16),
        "model.ids": torch.arange(-50, 50, dtype=torch.int8),
        "model.mask": torch.rand(17, generator=g) > 0.5,
        "model.f8": torch.randn(9, 3, generator=g).to(torch.float8_e4m3fn),
        "model.big": torch.randn(300, 700, generator=g).to(torch.bfloat16),
        "model.i64": torch.arange(11, dtype=torch.int64) * 7,
    }


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("formats")
    hf = d / "hf"
    hf.mkdir()
    hub.save_torch_state_dict(_state(), str(hf), max_shard_size="200KB")
    single = d / "single.safetensors"
    safetensors_torch.save_file(
        {k: v for k, v in _state().items() if k != "lm_head.weight"}, str(single)
    )
    convert(str(hf), str(d / "sp"))
    convert(str(hf), str(d / "raw"), compression="none", shards=2)
    sptorch.save(dict(_state()), str(d / "model.pt"))
    return {
        "hf": str(hf),
        "single": str(single),
        "sp": str(d / "sp"),
        "raw": str(d / "raw"),
        "sp_single_file": str(d / "model.pt"),
    }


def _reference(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of an HF directory or file, through the safetensors library itself."""
    out: dict[str, torch.Tensor] = {}
    files = (
        [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")]
        if os.path.isdir(path)
        else [path]
    )
    for f in files:
        with safetensors_torch.safe_open(f, framework="pt") as s:
            for k in s.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[k] = s.get_tensor(k)
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(a.contiguous().view(-1).view(torch.uint8).numpy()) == bytes(
        b.contiguous().view(-1).view(torch.uint8).numpy()
    )


@pytest.mark.parametrize("fmt", ["hf", "sp", "raw"])
@pytest.mark.parametrize("io", ["pread", "mmap"])
def test_equals_safe_open_bit_for_bit(formats: dict[str, str], fmt: str, io: str) -> None:
    want = _reference(formats["hf"])
    # the hub stored the tied pair once
    assert ("lm_head.weight" in want) != ("model.embed_tokens.weight" in want)
    got = dict(sptorch.weights_iterator(formats[fmt], io=io))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert _same_bits(got[k], v), k


def test_single_files(formats: dict[str, str]) -> None:
    want = _reference(formats["single"])
    got = dict(sptorch.weights_iterator(formats["single"], threads=1))
    assert sorted(got) == sorted(want)
    assert all(_same_bits(got[k], want[k]) for k in want)
    # sptorch.save keeps both tied names: the alias comes out as the same value
    st = dict(sptorch.weights_iterator(formats["sp_single_file"]))
    assert sorted(st) == sorted(_state())
    for k, v in _state().items():
        assert _same_bits(st[k], v), k
    assert st["lm_head.weight"] is st["model.embed_tokens.weight"]


def test_file_order(formats: dict[str, str]) -> None:
    with sp.open(formats["raw"]) as r:
        where = {k: (r.info(k).shard, r.info(k).offset) for k in r.keys()}
    names = [n for n, _ in sptorch.weights_iterator(formats["raw"])]
    assert names == sorted(names, key=lambda n: where[n])  # shard by shard, in file order
    # every entry, once: nothing of a shard left out (which shard of the two a value went to is
    # the writer's choice of a free one at the time, so the count of files used is not fixed)
    assert sorted(names) == sorted(where)
    assert {where[n][0] for n in names} == {s for s, _ in where.values()}


def test_tensors_own_their_memory_and_outlive_the_iterator(formats: dict[str, str]) -> None:
    for fmt in ("hf", "sp", "raw"):
        it = sptorch.weights_iterator(formats[fmt])
        got = dict(it)
        it.close()
        ptrs = [t.untyped_storage().data_ptr() for t in got.values() if t.numel()]
        assert len(ptrs) == len(set(ptrs)), fmt  # no shared (reused) buffer
        for t in got.values():
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
        before = {k: v.clone() for k, v in got.items()}
        got["model.big"].zero_()  # writing one touches no other, and never the file
        for k, v in got.items():
            if k != "model.big":
                assert _same_bits(v, before[k]), (fmt, k)
    again = dict(sptorch.weights_iterator(formats["raw"]))
    assert _same_bits(again["model.big"], _reference(formats["hf"])["model.big"])


def test_stats_after_the_end(formats: dict[str, str]) -> None:
    with sptorch.weights_iterator(formats["sp"]) as it:
        n = sum(t.numel() * t.element_size() for _, t in it)
    assert it.raw_bytes == n
    assert 0 < it.bytes_read < n  # the default codec: fewer bytes stored than handed out
    assert it.seconds > 0


def _flip(path: pathlib.Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_damaged_byte_names_the_key(tmp_path: pathlib.Path, compression: str) -> None:
    state = {f"layer.{i}.weight": torch.randn(64, 64) for i in range(6)}
    sptorch.save(state, str(tmp_path / "ck"), compression=compression)
    with sp.open(str(tmp_path / "ck")) as r:
        info = r.info("layer.3.weight")
        shard = r.format_info["shards"][info.shard][0]
    _flip(pathlib.Path(shard), info.offset + info.stored_bytes // 2)
    seen = []
    with pytest.raises(sp.ChecksumMismatchError, match="layer.3.weight"):
        for name, _ in sptorch.weights_iterator(str(tmp_path / "ck")):
            seen.append(name)
    assert "layer.3.weight" not in seen


def test_names_filter(formats: dict[str, str]) -> None:
    got = dict(sptorch.weights_iterator(formats["sp"], names=["model.big", "model.one"]))
    assert sorted(got) == ["model.big", "model.one"]
    got = dict(sptorch.weights_iterator(formats["hf"], names=lambda n: n.startswith("model.l")))
    assert sorted(got) == ["model.layers.0.k.weight", "model.layers.0.norm.weight",
                           "model.layers.0.q.weight"]  # fmt: skip
    with pytest.raises(KeyError, match="nope"):
        sptorch.weights_iterator(formats["sp"], names=["model.big", "nope"])
    st = dict(sptorch.weights_iterator(formats["sp_single_file"], names=["lm_head.weight"]))
    assert list(st) == ["lm_head.weight"]  # a tied name alone reads its stored value
    with pytest.raises(sp.InvalidArgumentError):
        sptorch.weights_iterator(formats["sp"], threads=0)


def test_window_bounds_what_is_held(tmp_path: pathlib.Path) -> None:
    state = {f"w.{i:03d}": torch.full((256, 256), float(i)) for i in range(40)}  # 256 KiB each
    sptorch.save(state, str(tmp_path / "ck"), compression="none")
    window = 1 << 20
    it = sptorch.weights_iterator(str(tmp_path / "ck"), window=window)
    peak = 0
    for name, t in it:
        peak = max(peak, it._inflight)
        assert float(t[0, 0]) == float(int(name[2:]))
    assert 0 < peak <= window
    # a value larger than the window is still read (alone)
    big = dict(sptorch.weights_iterator(str(tmp_path / "ck"), window=1000))
    assert len(big) == 40


def test_close_early_stops_reading(tmp_path: pathlib.Path) -> None:
    state = {f"w.{i:03d}": torch.randn(512, 512) for i in range(200)}  # 200 MiB: several batches
    sptorch.save(state, str(tmp_path / "ck"), compression="none")
    it = sptorch.weights_iterator(str(tmp_path / "ck"))
    first = next(it)
    it.close()
    assert not it._thread.is_alive()
    assert torch.equal(first[1], state[first[0]])
    with pytest.raises(StopIteration):
        next(it)


def _mapped(paths: list[str]) -> set[str]:
    want = {os.path.realpath(p) for p in paths}
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if line.split()[-1] in want}


def _data_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")]
    if path.endswith(".safetensors") or os.path.isfile(path):
        return [path]
    with sp.open(path) as r:
        return [f for f, _ in r.format_info["shards"]]


@pytest.mark.parametrize("fmt", ["hf", "single", "raw", "sp_single_file"])
def test_io_pread_never_maps(formats: dict[str, str], fmt: str) -> None:
    """``io="pread"`` means the same for every format: no file is mapped (the fix for
    Hugging Face directories, which mapped their shards whatever ``io`` said)."""
    path = formats[fmt]
    files = _data_files(path)
    with sp.open(path, io="pread") as r:
        keys = r.keys()
        for k in keys:
            r[k]
        r.load()
        big = next(k for k in keys if r.info(k).shape and r.info(k).shape[0] > 1)
        r.get_slice(big)[1:]
        r.slice(big, 0, 1)
        assert _mapped(files) == set(), fmt
    with sptorch.weights_iterator(path, io="pread") as it:
        for _ in it:
            assert _mapped(files) == set(), fmt
    # the mapped mode does map (the check above can fail)
    with sp.open(path, io="mmap") as r:
        views = [r[k] for k in r.keys()]
        assert _mapped(files), fmt
        del views


@pytest.fixture(scope="module")
def big_hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, torch.Tensor]]:
    """A safetensors file whose large values start at offsets no page boundary would give."""
    g = torch.Generator().manual_seed(41)
    state = {
        "a.bias": torch.randn(7, generator=g),  # shifts what follows off any alignment
        "b.weight": torch.randn(1000, 1500, generator=g).to(torch.bfloat16),  # 3 MB
        "c.norm": torch.randn(3, generator=g).to(torch.float16),
        "d.weight": torch.randn(700, 900, generator=g),  # 2.5 MB
    }
    path = tmp_path_factory.mktemp("big_hf") / "model.safetensors"
    safetensors_torch.save_file(state, str(path))
    return str(path), state


@pytest.mark.parametrize("direct", [False, True, "cold"])
def test_large_values_own_a_mapping_and_read_cold(
    big_hf: tuple[str, dict[str, torch.Tensor]], direct: bool | str, monkeypatch
) -> None:
    """From cold files, with and without the cold-read engine (``direct``: values of 1 MiB or
    more in a mapping of their own, placed for in-place ``O_DIRECT`` reads): bit for bit what
    was saved, and alive after the iterator is gone."""
    path, state = big_hf
    # "cold" takes the engine for reads of 512 MiB or more: this 5.5 MB file qualifies here
    monkeypatch.setattr("shardpoint.torch.weights.AUTO_MIN", 0)
    cold = evict(path)
    it = sptorch.weights_iterator(path, io="pread", direct=direct)
    got = dict(it)
    kinds = it._reader.read_kinds
    del it
    gc.collect()
    assert sorted(got) == sorted(state)
    for k, v in state.items():
        assert _same_bits(got[k], v), k
    total = sum(v.numel() * v.element_size() for v in state.values())
    if not direct:
        assert kinds == (0, 0, 0)
        return
    assert sum(kinds) == total
    # direct=True reads a piece it finds cached from the cache, and the kernel's read-ahead of
    # a buffered read (the header's) can run ahead into the values before the engine gets
    # there, by a margin that depends on timing (CI once saw 2.5 of 5.5 MB cached): only the
    # "cold" route, which reads every piece from the device, is held to reading in place
    if direct == "cold" and cold and takes_o_direct(path):
        # the interiors of the two large values were read where they lie
        assert kinds[0] >= 5_000_000, kinds
        assert kinds[2] == 0, kinds


def test_direct_reads_in_place_when_placed(tmp_path: pathlib.Path) -> None:
    """The cold-read engine DMAs a cold value straight into a destination placed congruent to
    its file offset, and bounces one that is not; both exact."""
    data = np.random.default_rng(41).integers(0, 255, 20 << 20, dtype=np.uint8)
    f = tmp_path / "blob"
    f.write_bytes(data.tobytes())
    cold = evict(f)
    off, n = 12345, 9 << 20
    m = mmap.mmap(-1, n + 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    placed = np.frombuffer(m, dtype=np.uint8, count=n, offset=off % 4096)
    # not congruent to its file offset (15 MiB, a page multiple) whatever the allocator does:
    # one byte into a fresh mapping (np.empty's address was once page-aligned, read in place)
    m2 = mmap.mmap(-1, (3 << 20) + 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    other = np.frombuffer(m2, dtype=np.uint8, count=3 << 20, offset=1)
    in_place, bounced, cached = read_ranges_direct(
        [str(f)], [(0, off), (0, 15 << 20)], [placed, other]
    )
    assert np.array_equal(placed, data[off : off + n])
    assert np.array_equal(other, data[15 << 20 : 18 << 20])
    assert in_place + bounced + cached == n + (3 << 20)
    if not (cold and takes_o_direct(str(f))):
        return  # every piece was read with pread, or from the cache (checked above)
    assert in_place > 8 << 20 and bounced >= 3 << 20, (in_place, bounced, cached)
    del placed, other


def test_direct_range_past_the_end_names_the_file(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "short.safetensors"
    f.write_bytes(b"x" * 100)
    with pytest.raises(sp.CorruptCheckpointError, match="short.safetensors"):
        read_ranges_direct([str(f)], [(0, 60)], [np.empty(50, dtype=np.uint8)])


def test_loader_option_direct() -> None:
    from shardpoint.torch.weights import loader_options

    assert loader_options({"direct": True}, "x") == {"direct": True}
    with pytest.raises(ValueError, match='direct must be true, false, "cold" or "auto"'):
        loader_options({"direct": "yes"}, "x")


def test_first_batches_ramp_up(tmp_path: pathlib.Path) -> None:
    """The first batch is small (the consumer waits for all of it, with nothing to overlap),
    each next one twice the last up to the limit; every value once, in file order."""
    state = {f"w.{i:03d}": torch.full((256, 1024), float(i)) for i in range(40)}  # 1 MiB each
    sptorch.save(state, str(tmp_path / "ck"), compression="none")
    with sptorch.weights_iterator(str(tmp_path / "ck")) as it:
        plan = it._plan
        mib = 1 << 20
        sizes = [sum(i.raw_bytes for i in b) // mib for b in plan.batches(8 * mib, 2 * mib)]
        assert sizes[:4] == [2, 4, 8, 8]
        assert sum(sizes) == 40
        flat = [i.key for b in plan.batches(8 * mib, 2 * mib) for i in b]
        assert flat == [i.key for i in plan.infos]
        assert [len(b) for b in plan.batches(8 * mib)][:2] == [8, 8]  # no ramp asked
        got = {n: float(t[0, 0]) for n, t in it}
    assert got == {k: float(v[0, 0]) for k, v in state.items()}


@pytest.mark.parametrize("deterministic", [False, True])
def test_small_values_are_tensors_of_their_own_in_any_mode(
    tmp_path: pathlib.Path, deterministic: bool
) -> None:
    """Each value is made as itself, not as a view of a byte tensor (whose Python object torch
    would keep alive beside it: twice the objects for the collector while values wait), and
    under ``torch.use_deterministic_algorithms`` (Lightning's ``deterministic=True``) a dtype
    ``torch.empty`` cannot fill there (float4) is still read: the memory is an array's, shaped
    in place (weights_alloc.own_tensor), so no value of any rank or dtype is a view."""
    g = torch.Generator().manual_seed(7)
    state = {
        f"w.{i:04d}": torch.randn(3 + i % 5, generator=g).to(torch.bfloat16) for i in range(600)
    }
    state["s.scalar"] = torch.tensor(-2.25, dtype=torch.float64)
    state["s.f4"] = torch.randint(0, 255, (4, 6), dtype=torch.uint8, generator=g).view(
        torch.float4_e2m1fn_x2
    )
    state["s.f8"] = torch.randn(5, 3, generator=g).to(torch.float8_e4m3fn)
    sptorch.save(state, str(tmp_path / "ck"), compression="none")
    plain = {k: v for k, v in state.items() if k != "s.f4"}
    safetensors_torch.save_file(plain, str(tmp_path / "m.safetensors"))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        for path, want in ((str(tmp_path / "ck"), state), (str(tmp_path / "m.safetensors"), plain)):
            got = dict(sptorch.weights_iterator(path, direct=False))
            assert sorted(got) == sorted(want), path
            for k, t in got.items():
                assert _same_bits(t, want[k]), (path, k)
                assert t._base is None, (path, k)  # its own allocation, not a view
                assert t.is_contiguous(), (path, k)
                assert t.untyped_storage().nbytes() == t.nbytes, (path, k)  # and only its bytes
    finally:
        torch.use_deterministic_algorithms(before)
