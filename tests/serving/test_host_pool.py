"""``weights_iterator``'s recycled host memory (``shardpoint/torch/host_pool.py``).

Large values are handed out in anonymous mappings of their own; a mapping whose tensor the
consumer dropped is reused for a later value instead of new memory being faulted in. What
must hold: every tensor handed out is independent memory, a tensor the consumer keeps is never
written again however far the iterator moves on, the pool stays within the window, and bad
files still fail with errors naming the file."""

from __future__ import annotations

import gc
import json
import pathlib

import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import shardpoint.torch as sptorch  # noqa: E402
from shardpoint.torch.host_pool import HUGE, HUGE_MIN, POOL_MIN, HostPool, size_class  # noqa: E402

_N = 24
_SHAPE = (512, 640)  # fp32: 1.25 MiB, pooled


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    out = {f"layers.{i:02d}.weight": torch.randn(*_SHAPE, generator=g) for i in range(_N)}
    out["layers.norm"] = torch.randn(33, generator=g)  # small: torch.empty, not pooled
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pool")
    state = _state()
    safetensors_torch.save_file(state, str(d / "model.safetensors"))
    sptorch.save(state, str(d / "ck"), compression="none")
    return {"hf": str(d / "model.safetensors"), "sp": str(d / "ck")}


def test_size_classes() -> None:
    assert POOL_MIN <= 4 * _SHAPE[0] * _SHAPE[1]
    for n in (1, 4095, 4096, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17, 80_089_728):
        c = size_class(n)
        assert n <= c <= max(4096, n + n // 8), n
        assert c % 4096 == 0
    # nearby sizes share a class (a model's layers reuse each other's mappings)
    assert size_class(3_000_000) == size_class(3_000_001)


@pytest.mark.parametrize("fmt", ["hf", "sp"])
def test_dropped_tensors_are_recycled_bit_exact(files: dict[str, str], fmt: str) -> None:
    """A consumer that copies and drops (an engine's ``load_weights``): mappings are reused,
    and every value is still exactly what was saved."""
    state = _state()
    window = 6 * _SHAPE[0] * _SHAPE[1] * 4  # a few values: the pool has to recycle
    it = sptorch.weights_iterator(files[fmt], window=window)
    seen = 0
    peak = 0
    for name, t in it:
        assert torch.equal(t, state[name]), name
        pool = it._pool
        assert pool is not None
        peak = max(peak, pool.free_bytes + it._inflight)
        seen += 1
        del t
    assert seen == len(state)
    assert it._pool is not None and it._pool.reused >= _N // 3
    # what the pool keeps free plus what is read ahead stays within the window (one value
    # may exceed it transiently while a batch larger than the room is placed)
    assert peak <= window + size_class(4 * _SHAPE[0] * _SHAPE[1])
    assert it._pool.free_bytes == 0  # emptied at the end


def test_pooled_values_share_their_file_offsets_cache_line_place(tmp_path: pathlib.Path) -> None:
    """A safetensors file whose header leaves every tensor 8 bytes past a cache line: each
    pooled value starts at its file offset's place in a cache line (the kernel's copy then
    runs aligned), bit for bit, recycled or not."""
    state = _state()
    # a metadata entry sized so that the data section starts at 8 mod 64
    for pad in range(64):
        path = tmp_path / f"m{pad}.safetensors"
        safetensors_torch.save_file(state, str(path), metadata={"p": "x" * pad})
        it = sptorch.weights_iterator(str(path), io="pread", window=4 * 4 * _SHAPE[0] * _SHAPE[1])
        offsets = {i.key: i.offset for i in it._plan.infos}
        if offsets["layers.00.weight"] % 64 == 8:
            break
        it.close()
    else:
        pytest.fail("no header length put the tensors 8 bytes past a cache line")
    n = 0
    for name, t in it:
        assert torch.equal(t, state[name]), name
        if t.numel() * t.element_size() >= POOL_MIN:
            assert t.data_ptr() % 64 == offsets[name] % 64 == 8, name
            n += 1
        del t
    assert n == _N and it._pool is not None and it._pool.reused > 0


@pytest.mark.parametrize("direct", [False, True])
def test_a_value_off_its_element_size_is_handed_out_aligned(
    tmp_path: pathlib.Path, direct: bool
) -> None:
    """A file (written by hand: safetensors' own writer orders tensors so this cannot happen)
    whose fp32 tensor lies 2 bytes off a multiple of 4: it is not placed at its offset (a
    tensor is always aligned to its element size), and it arrives exact on both routes."""
    g = torch.Generator().manual_seed(11)
    state = {
        "a.odd": torch.tensor([7, 9], dtype=torch.uint8),
        "b.weight": torch.randn(*_SHAPE, generator=g),
    }
    n = state["b.weight"].numel() * 4
    header = {
        "a.odd": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
        "b.weight": {"dtype": "F32", "shape": list(_SHAPE), "data_offsets": [2, 2 + n]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(
        len(text).to_bytes(8, "little")
        + text
        + state["a.odd"].numpy().tobytes()
        + state["b.weight"].numpy().tobytes()
    )
    it = sptorch.weights_iterator(str(path), io="pread", direct=direct)
    offsets = {i.key: i.offset for i in it._plan.infos}
    assert offsets["b.weight"] % 4 == 2
    got = dict(it)
    assert torch.equal(got["a.odd"], state["a.odd"])
    assert torch.equal(got["b.weight"], state["b.weight"])
    assert got["b.weight"].data_ptr() % 4 == 0


@pytest.mark.parametrize("fmt", ["hf", "sp"])
def test_kept_tensors_survive_the_iterator_moving_on(files: dict[str, str], fmt: str) -> None:
    """Every other tensor kept, the rest dropped: the kept ones are never reused for a later
    value, are independent of each other, and outlive the iterator."""
    state = _state()
    # four values and a page each: a value placed at its offset's cache-line place takes a
    # page more than its size class when it fills the class exactly (host_pool.py)
    window = 4 * (_SHAPE[0] * _SHAPE[1] * 4 + 4096)
    kept: dict[str, torch.Tensor] = {}
    with sptorch.weights_iterator(files[fmt], window=window) as it:
        for i, (name, t) in enumerate(it):
            if i % 2 == 0:
                kept[name] = t[1:]  # a view keeps its storage (and mapping) alive too
        reused = it._pool.reused if it._pool is not None else 0
    del it
    gc.collect()
    assert reused > 0  # the dropped half was recycled, so the check below can fail
    ptrs = [t.untyped_storage().data_ptr() for t in kept.values()]
    assert len(ptrs) == len(set(ptrs))
    for name, t in kept.items():
        assert torch.equal(t, state[name][1:]), name
    first = next(iter(kept))
    before = {k: v.clone() for k, v in kept.items()}
    kept[first].fill_(0.0)  # writing one touches no other
    for k, v in kept.items():
        if k != first:
            assert torch.equal(v, before[k]), k


def test_pool_reuses_only_after_the_last_reference() -> None:
    free = [1 << 30]
    pool = HostPool(lambda: free[0])
    a = pool.tensor(POOL_MIN)
    a.fill_(7)
    view = a[10:20]
    del a
    gc.collect()
    b = pool.tensor(POOL_MIN)  # the view still holds the first mapping
    assert pool.reused == 0
    assert int(view.sum()) == 70
    del view
    gc.collect()
    assert pool.free_bytes == size_class(POOL_MIN)
    c = pool.tensor(POOL_MIN - 100)  # same size class: the freed mapping
    assert pool.reused == 1 and pool.free_bytes == 0
    assert c.data_ptr() != b.data_ptr()
    # no room: a freed mapping is dropped, not kept
    free[0] = 0
    del c
    gc.collect()
    assert pool.free_bytes == 0
    free[0] = 1 << 30
    pool.close()
    del b
    gc.collect()
    assert pool.free_bytes == 0  # closed: nothing kept


def test_short_file_errors_name_the_file(files: dict[str, str], tmp_path: pathlib.Path) -> None:
    """A safetensors file cut inside a pooled value, and a shard cut the same way: a clear
    error naming the file, not a crash or short tensors."""
    data = pathlib.Path(files["hf"]).read_bytes()
    cut = tmp_path / "model.safetensors"
    cut.write_bytes(data[: len(data) - 3 * _SHAPE[0] * _SHAPE[1]])
    with pytest.raises(sp.CheckpointError, match="model.safetensors"):
        for _ in sptorch.weights_iterator(str(cut)):
            pass
    src = pathlib.Path(files["sp"])
    with sp.open(str(src)) as r:
        shard = r.format_info["shards"][0][0]
    for p in src.parent.glob(src.name + ".*"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    short = tmp_path / pathlib.Path(shard).name
    short.write_bytes(short.read_bytes()[: short.stat().st_size // 2])
    with pytest.raises(sp.CheckpointError, match=short.name):
        for _ in sptorch.weights_iterator(str(tmp_path / src.name)):
            pass


def test_large_values_fill_whole_huge_pages_after_their_lead_page() -> None:
    """A value of ``HUGE_MIN`` or more: its class is rounded up to whole huge pages (what the
    window counts is what may be resident), and it starts ``lead`` bytes into the small page
    just before a huge-page boundary, so the rest of it lies in whole huge pages, for a fresh
    mapping and for a recycled one alike. Smaller values keep their page-grained class."""
    pool = HostPool(lambda: 1 << 30)
    for nbytes, lead in [(HUGE_MIN, 0), (5 << 20, 100), ((80 << 20) + 12345, 4095)]:
        before = pool.free_bytes
        for _ in range(2):  # fresh, then recycled
            t = pool.tensor(nbytes, lead)
            assert t.numel() == nbytes
            assert (t.data_ptr() - lead + 4096) % HUGE == 0, (nbytes, lead)
            t.fill_(3)  # the whole value is writable memory of the mapping
            del t
            gc.collect()
        assert pool.free_bytes - before == -(-size_class(nbytes) // HUGE) * HUGE
    assert pool.reused == 3
    small = pool.tensor(HUGE_MIN - 4096, 64)
    assert small.data_ptr() % 4096 == 64
    pool.close()
