"""The cold-read engine's memory (``direct=True``; docs/SERVING.md, "Issue 41 (seventh round)").

Two costs that made a direct load pay a page fault per 4 KiB of the model, and so more CPU
than the buffered route: the engine's bounce buffers (``calloc``ed per worker per call, and
cleared whole once glibc served them from a heap) and the iterator's values (a fresh mapping
each, never recycled). What must hold now: the engine touches only the bounce pages it reads
into, the iterator places values in the pool's recycled mappings at their file offset's page
offset (so the device still writes in place), and every value is bit for bit what was saved.
A shardpoint checkpoint's uncompressed values are read by the same engine with ``direct=True``
and checked against their crc32c after they land: damage and truncation still raise errors
naming the key or the file.
"""

from __future__ import annotations

import gc
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import shardpoint.torch as sptorch  # noqa: E402
from page_cache import evict, takes_o_direct  # noqa: E402
from shardpoint.torch.host_pool import HostPool, size_class  # noqa: E402


def test_pool_places_a_tensor_at_its_lead() -> None:
    pool = HostPool(lambda: 1 << 30)
    a = pool.tensor(3_000_000, lead=1234)
    assert a.data_ptr() % 4096 == 1234 and a.numel() == 3_000_000
    a.fill_(5)
    del a
    gc.collect()
    # the freed mapping serves a value of the same class at another lead, whole and writable
    assert size_class(3_000_000 + 1234) == size_class(3_000_000 - 4000 + 4000)
    b = pool.tensor(3_000_000 - 4000, lead=4000)
    assert pool.reused == 1 and b.data_ptr() % 4096 == 4000
    b.fill_(9)
    assert int(b.sum()) == 9 * b.numel()
    with pytest.raises(ValueError, match="lead"):
        pool.tensor(1 << 20, lead=4096)
    pool.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, torch.Tensor]]:
    """A safetensors file of 24 values of 1.2 MB, the first shifted off any page alignment."""
    g = torch.Generator().manual_seed(417)
    state = {"a.bias": torch.randn(5, generator=g)}
    state.update({f"l.{i:02d}.weight": torch.randn(600, 500, generator=g) for i in range(24)})
    path = tmp_path_factory.mktemp("direct_mem") / "model.safetensors"
    safetensors_torch.save_file(state, str(path))
    return str(path), state


def test_direct_values_recycle_the_pool_in_place(
    model: tuple[str, dict[str, torch.Tensor]],
) -> None:
    """Cold, a window of a few values, a consumer that drops each value: the values come out
    of recycled mappings, each placed at its file offset's page offset, bit for bit."""
    path, state = model
    cold = evict(path)
    window = 5 * 600 * 500 * 4
    it = sptorch.weights_iterator(path, io="pread", direct=True, window=window)
    offsets = {i.key: i.offset for i in it._plan.infos}
    seen = 0
    for name, t in it:
        assert torch.equal(t, state[name]), name
        if t.numel() * t.element_size() >= 1 << 20:
            assert t.data_ptr() % 4096 == offsets[name] % 4096, name
        seen += 1
        del t
    assert seen == len(state)
    pool = it._pool
    assert pool is not None and pool.reused >= 8
    in_place, bounced, cached = it._reader.read_kinds
    assert in_place + bounced + cached == sum(v.numel() * 4 for v in state.values())
    if cold and takes_o_direct(path):
        assert in_place > 16 * 600 * 500 * 4, (in_place, bounced, cached)


_FAULTS = textwrap.dedent(
    """
    import mmap, os, resource, sys
    import numpy as np
    from shardpoint.storage import read_ranges_direct
    path = sys.argv[1]
    n = 4 << 20
    outs = []
    for k in range(4):  # placed congruent to the file offsets, pre-faulted
        m = mmap.mmap(-1, n + 8192, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        a = np.frombuffer(m, dtype=np.uint8, count=n, offset=(100 + k * n) % 4096)
        a[:] = 1
        outs.append(a)
    def cold():
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    cold()
    read_ranges_direct([path], [(0, 100 + k * n) for k in range(4)], outs)  # warms glibc up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        cold()
        read_ranges_direct([path], [(0, 100 + k * n) for k in range(4)], outs)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def test_direct_engine_touches_only_the_bounce_pages_it_uses(tmp_path: pathlib.Path) -> None:
    """Six cold calls reading 16 MiB in place into pre-faulted memory: a few hundred page
    faults (threads' stacks, the head and tail blocks bounced), not a cleared bounce buffer of
    8 MiB per worker per call (2,048 faults each: 12k+ over these calls before the fix)."""
    f = tmp_path / "blob"
    data = np.random.default_rng(7).integers(0, 255, (16 << 20) + 8192, dtype=np.uint8)
    f.write_bytes(data.tobytes())
    if not takes_o_direct(str(f)):
        pytest.skip("this file system refuses O_DIRECT: the engine reads with pread")
    evict(str(f))
    r = subprocess.run(
        [sys.executable, "-c", _FAULTS, str(f)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    faults = int(r.stdout.split()[-1])
    assert faults < 3000, faults


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same values saved uncompressed and with the default codec."""
    g = torch.Generator().manual_seed(4107)
    state = {"a.bias": torch.randn(5, generator=g)}
    state.update({f"l.{i:02d}.weight": torch.randn(700, 500, generator=g) for i in range(8)})
    state["m.half"] = torch.randn(1100, 600, generator=g).to(torch.bfloat16)
    d = tmp_path_factory.mktemp("direct_sp")
    sptorch.save(state, str(d / "none"), compression="none")
    sptorch.save(state, str(d / "default"))
    sptorch.save(state, str(d / "single.pt"), single_file=True)
    return {"none": str(d / "none"), "default": str(d / "default"), "single": str(d / "single.pt")}


def _copy(prefix: str, to: pathlib.Path) -> str:
    """A copy of checkpoint ``prefix``'s files in ``to`` (to damage); its prefix."""
    src = pathlib.Path(prefix)
    if src.is_file():  # a single-file checkpoint
        (to / src.name).write_bytes(src.read_bytes())
    for p in src.parent.glob(src.name + ".*"):
        (to / p.name).write_bytes(p.read_bytes())
    return str(to / src.name)


def _shards(prefix: str) -> list[str]:
    """The files holding the values of checkpoint ``prefix`` (a single file is its own)."""
    p = pathlib.Path(prefix)
    return sorted(str(f) for f in p.parent.glob(p.name + ".data-*")) or [prefix]


@pytest.mark.parametrize("codec", ["none", "default"])
def test_checkpoint_values_read_direct_bit_exact(checkpoints: dict[str, str], codec: str) -> None:
    """A shardpoint checkpoint with ``direct=True``, cold: uncompressed values read by the
    cold-read engine (in place where the file system takes ``O_DIRECT``), compressed ones in
    blocks of whole chunks by the same engine; every value bit for bit, large uncompressed
    ones placed at their page offset (compressed ones are decoded, not read in place)."""
    from shardpoint.storage.direct_reads import read_entries_direct

    prefix = checkpoints[codec]
    with sp.open(prefix) as r:
        state = {k: np.ascontiguousarray(r[k]).tobytes() for k in r.keys()}
    for f in _shards(prefix):
        evict(f)
    it = sptorch.weights_iterator(prefix, direct=True, window=3 << 20)
    assert it._p._direct
    offsets = {i.key: i.offset for i in it._plan.infos}
    n = 0
    for name, t in it:
        assert t.reshape(-1).view(torch.uint8).numpy().tobytes() == state[name], name
        if t.numel() * t.element_size() >= 1 << 20 and codec == "none":
            assert t.data_ptr() % 4096 == offsets[name] % 4096, name
        n += 1
    assert n == len(state)
    # the engine's own account: uncompressed bytes went through O_DIRECT
    cold = evict(*_shards(prefix))
    with sp.open(prefix) as r:
        infos = [r.info(k) for k in r.keys()]
        outs = [np.empty(i.raw_bytes, dtype=np.uint8) for i in infos]
        in_place, bounced, cached = read_entries_direct(r._core, infos, outs, True)
        for i, o in zip(infos, outs, strict=True):
            assert o.tobytes() == state[i.key], i.key
    stored = sum(i.raw_bytes if i.codec == "none" else i.stored_bytes for i in infos)
    assert in_place + bounced + cached == stored
    if cold and takes_o_direct(_shards(prefix)[0]):
        assert in_place + bounced > stored // 2, (in_place, bounced, cached)


def test_checkpoint_damage_is_caught_after_a_direct_read(
    checkpoints: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """One flipped byte inside an uncompressed value: ``direct=True`` raises the checksum
    error naming the key (crc over the bytes landed); with ``verify=False`` it is not checked."""
    prefix = _copy(checkpoints["none"], tmp_path)
    with sp.open(prefix) as r:
        info = r.info("l.03.weight")
        shard = _shards(prefix)[info.shard]
    data = bytearray(pathlib.Path(shard).read_bytes())
    data[info.offset + 1000] ^= 0x10
    pathlib.Path(shard).write_bytes(bytes(data))
    evict(shard)
    with pytest.raises(sp.ChecksumMismatchError, match="l.03.weight"):
        for _ in sptorch.weights_iterator(prefix, direct=True):
            pass
    got = dict(sptorch.weights_iterator(prefix, direct=True, verify=False))
    assert len(got) == 10


def test_checkpoint_truncated_shard_names_the_file(
    checkpoints: dict[str, str], tmp_path: pathlib.Path
) -> None:
    prefix = _copy(checkpoints["none"], tmp_path)
    last = pathlib.Path(_shards(prefix)[-1])
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(sp.CheckpointError, match=last.name):
        for _ in sptorch.weights_iterator(prefix, direct=True):
            pass


def test_compressed_damage_and_truncation_named_after_a_direct_read(
    checkpoints: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """The default codec with ``direct=True``, cold: a flipped stored byte raises an error
    naming the key whatever ``verify`` says (compressed values are always checked), and a
    shard cut in half names the file; neither hangs the engine's readers."""
    prefix = _copy(checkpoints["default"], tmp_path)
    with sp.open(prefix) as r:
        info = r.info("l.03.weight")
        assert info.codec != "none"
        shard = _shards(prefix)[info.shard]
    data = bytearray(pathlib.Path(shard).read_bytes())
    data[info.offset + info.stored_bytes // 2] ^= 0x10
    pathlib.Path(shard).write_bytes(bytes(data))
    for verify in (True, False):
        evict(shard)
        with pytest.raises(sp.CorruptCheckpointError, match="l.03.weight"):
            for _ in sptorch.weights_iterator(prefix, direct=True, verify=verify):
                pass
    last = pathlib.Path(_shards(prefix)[-1])
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    evict(str(last))
    with pytest.raises(sp.CheckpointError, match=last.name):
        for _ in sptorch.weights_iterator(prefix, direct=True):
            pass


@pytest.mark.parametrize("codec", ["none", "default"])
@pytest.mark.parametrize("verify", [True, False])
def test_direct_reads_the_files_opened_when_saved_again_mid_load(
    tmp_path: pathlib.Path, codec: str, verify: bool
) -> None:
    """A checkpoint saved again at the same prefix while a ``direct=True`` iterator is part way
    through: the rest of the values come from the files the iterator opened (the engine reads
    the reader's own open files, not their paths), bit for bit what was first saved, with or
    without crc checks (without them, other files' bytes would pass unnoticed)."""
    g = torch.Generator().manual_seed(77)
    first = {f"w.{i}": torch.randn(600, 500, generator=g) for i in range(6)}
    second = {k: v + 1.0 for k, v in first.items()}
    prefix = str(tmp_path / "ckpt")
    kw = {"compression": "none"} if codec == "none" else {}
    sptorch.save(first, prefix, **kw)
    for f in _shards(prefix):
        evict(f)
    it = iter(sptorch.weights_iterator(prefix, direct=True, verify=verify, window=1 << 20))
    got = dict([next(it)])
    sptorch.save(second, prefix, **kw)
    for f in _shards(prefix):
        evict(f)
    got.update(it)
    assert sorted(got) == sorted(first)
    for k, v in first.items():
        assert torch.equal(got[k], v), k
    with sp.open(prefix) as r:
        assert np.array_equal(r["w.0"], second["w.0"].numpy())


@pytest.mark.parametrize("layout", ["default", "none", "single"])
def test_load_into_reads_a_cold_checkpoint_direct(
    checkpoints: dict[str, str],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
) -> None:
    """``load_into`` of a checkpoint mostly not in the page cache, read large enough
    (``COLD_MIN``, lowered here): every value through the cold-read engine (compressed and
    uncompressed: the page cache is left as it was), every value exact; a warm checkpoint or a
    small read take the buffered call; overlapping targets are refused by name on either
    route; a damaged value is named whatever the route."""
    from shardpoint.storage import direct_reads
    from shardpoint.storage.io_mode import cached_fraction

    prefix = checkpoints[layout]
    with sp.open(prefix) as r:  # copies, then closed: mapped pages could not be evicted
        want = {k: np.array(r[k], copy=True) for k in r.keys()}
        codecs = {r.info(k).codec for k in r.keys()}
    with sp.open(prefix) as r:
        core = r._core
        keys = sorted(want)
        outs = [np.zeros(want[k].nbytes, np.uint8) for k in keys]
        if layout == "none":
            assert codecs == {"none"}
        else:
            assert codecs >= {"none"} and len(codecs) > 1  # mixed: both kinds of value
        monkeypatch.setattr(direct_reads, "COLD_MIN", 1)
        cold = evict(*_shards(prefix))
        assert direct_reads.read_cold_into(core, keys, outs, True)
        for k, o in zip(keys, outs, strict=True):
            assert o.tobytes() == want[k].tobytes(), k
        if cold and all(takes_o_direct(f) for f in _shards(prefix)):
            # every byte came by O_DIRECT: a buffered read would have filled the cache
            assert max(cached_fraction(f) for f in _shards(prefix)) < 0.25
        for f in _shards(prefix):  # warm (direct reads leave the page cache as it was)
            pathlib.Path(f).read_bytes()
        assert not direct_reads.read_cold_into(core, keys, outs, True)
        for f in _shards(prefix):
            evict(f)
        with pytest.raises(ValueError, match="overlap"):
            direct_reads.read_cold_into(core, keys, [outs[0]] * len(keys), True)
        monkeypatch.setattr(direct_reads, "COLD_MIN", 1 << 40)
        assert not direct_reads.read_cold_into(core, keys, outs, True)
    monkeypatch.setattr(direct_reads, "COLD_MIN", 1)
    targets = {k: np.zeros_like(v) for k, v in want.items()}
    for f in _shards(prefix):
        evict(f)
    with sp.open(prefix) as r:
        r.load_into(targets)
    for k, v in want.items():
        assert np.array_equal(targets[k].view(np.uint8), v.view(np.uint8)), k
    bad = _copy(prefix, tmp_path)
    with sp.open(bad) as r:
        info = r.info("l.03.weight")
        shard = _shards(bad)[info.shard]
    data = bytearray(pathlib.Path(shard).read_bytes())
    base = 4096 if layout == "single" else 0  # FORMAT.md §10: the shard region's offset
    data[base + info.offset + info.stored_bytes // 2] ^= 0x10
    pathlib.Path(shard).write_bytes(bytes(data))
    evict(shard)
    with sp.open(bad) as r, pytest.raises(sp.CorruptCheckpointError, match="l.03.weight"):
        r.load_into({k: np.zeros_like(v) for k, v in want.items()})


@pytest.mark.parametrize("layout", ["hf", "none"])
def test_many_small_values_of_a_cold_load_are_read_by_the_engine_in_groups(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """A cold ``load_into`` of many small values between large ones reads all of them with
    the cold-read engine (small neighbours share one read: ``rust/src/direct/groups.rs``),
    every value exact and, ``O_DIRECT`` taken, the page cache left empty (a Hugging Face
    reader counts every byte as read by the engine); a damaged small value and a damaged
    large one are named; overlapping targets are refused by name."""
    from shardpoint.storage import direct_reads
    from shardpoint.storage.io_mode import cached_fraction

    g = torch.Generator().manual_seed(11)
    state: dict[str, torch.Tensor] = {}
    for i in range(3):
        state[f"big.{i}"] = torch.randn(600, 700, generator=g)  # 1.6 MiB
        for j in range(400):
            state[f"small.{i}.{j:03d}"] = torch.randn(256 + j, generator=g)  # 1-2.6 KiB
    if layout == "hf":
        path = tmp_path / "model"
        path.mkdir()
        safetensors_torch.save_file(state, str(path / "model.safetensors"))
        files = [str(path / "model.safetensors")]
    else:
        path = tmp_path / "ck"
        sptorch.save(state, str(path), compression="none")
        files = _shards(str(path))
    monkeypatch.setattr(direct_reads, "COLD_MIN", 1)
    every = sum(v.numel() * 4 for v in state.values())

    def load(targets: dict[str, np.ndarray]) -> None:
        cold = evict(*files) and all(takes_o_direct(f) for f in files)
        with sp.open(str(path)) as r:
            r.load_into(targets)
            if layout == "hf":
                assert sum(r.read_kinds) == every, r.read_kinds  # the engine: every value
        if cold:  # a buffered read (the kernel's read-ahead) would have filled the cache
            assert max(cached_fraction(f) for f in files) < 0.25

    targets = {k: np.zeros(v.shape, np.float32) for k, v in state.items()}
    load(targets)
    for k, v in state.items():
        assert np.array_equal(targets[k], v.numpy()), k
    shared = np.zeros(600 * 700, np.float32)
    crossed = {k: np.zeros(v.shape, np.float32) for k, v in state.items()}
    crossed["small.1.000"] = shared[:256]  # inside big.0's target
    crossed["big.0"] = shared.reshape(600, 700)
    with pytest.raises(ValueError, match="overlap"):
        load(crossed)
    # damage: a shardpoint checkpoint's (a safetensors file has no checksums to name it by)
    for victim in ("small.2.105", "big.1") if layout == "none" else ():
        damaged = tmp_path / victim
        damaged.mkdir()
        prefix = _copy(str(path), damaged)
        with sp.open(prefix) as r:
            info = r.info(victim)
        shard = pathlib.Path(_shards(prefix)[info.shard])
        data = bytearray(shard.read_bytes())
        data[info.offset + info.stored_bytes // 2] ^= 0x20
        shard.write_bytes(bytes(data))
        evict(str(shard))
        with sp.open(prefix) as r, pytest.raises(sp.ChecksumMismatchError, match=victim):
            r.load_into({k: np.zeros(v.shape, np.float32) for k, v in state.items()})
