"""Reader.get_slice: safetensors' lazy slices, numpy-style on every axis, reading only what the
selection needs; and the metadata/dtype parts of the storage face that safetensors users rely on
(exact user metadata beside our own sections, float8 fnuz/e8m0 and packed fp4)."""

from __future__ import annotations

import ctypes
import mmap
import os
import random

import ml_dtypes
import numpy as np
import pytest

import shardpoint as sp
from shardpoint.errors import ChecksumMismatchError, InvalidArgumentError, InvalidSliceError

safetensors_numpy = pytest.importorskip("safetensors.numpy")
from safetensors import safe_open  # noqa: E402

from page_cache import evict  # noqa: E402


def random_index(rng: random.Random, shape: tuple[int, ...]) -> tuple:
    """ints (negative too), slices with any non-zero step and in-range bounds, an Ellipsis."""
    idx: list = []
    for size in shape:
        c = rng.random()
        if c < 0.25:
            idx.append(rng.randrange(-size, size))
        else:
            step = rng.choice([None, 1, 2, 3, 7, -1, -2, -5])
            lo = rng.choice([None, rng.randrange(-size, size + 1)])
            hi = rng.choice([None, rng.randrange(-size, size + 1)])
            idx.append(slice(lo, hi, step))
    c = rng.random()
    if c < 0.3:  # fewer indices than dimensions
        idx = idx[: rng.randrange(len(idx) + 1)]
    elif c < 0.6:  # an Ellipsis standing for zero or more axes
        i = rng.randrange(len(idx) + 1)
        j = rng.randrange(i, len(idx) + 1)
        idx = idx[:i] + [Ellipsis] + idx[j:]
    return tuple(idx)


@pytest.fixture(scope="module")
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "cube": rng.standard_normal((37, 29, 11)).astype(np.float32),
        "wide": np.arange(600 * 500, dtype=np.float64).reshape(600, 500),
        "vec": np.arange(100_000, dtype=np.int32),
        "bf16": rng.standard_normal((64, 96)).astype(ml_dtypes.bfloat16),
        "scalar": np.array(2.5, dtype=np.float32),
    }


@pytest.mark.parametrize("compression,run_bytes", [("none", None), ("zstd", None), ("zstd", 3000)])
def test_get_slice_matches_numpy_on_every_axis(
    tmp_path, monkeypatch, arrays, compression, run_bytes
):
    """Random indices on every axis; run_bytes=3000 cuts compressed reads into many runs."""
    if run_bytes is not None:
        import shardpoint.storage.slicing

        monkeypatch.setattr(shardpoint.storage.slicing, "RUN_BYTES", run_bytes)
    p = tmp_path / "ck"
    sp.save_file(arrays, p, compression=compression, chunk_bytes=4096, durable=False)
    rng = random.Random(f"{compression}{run_bytes}")
    with sp.open(p) as r:
        if compression == "zstd":
            assert r.info("wide").codec != "none" and r.info("wide").chunks > 1
        for key in ("cube", "wide", "vec", "bf16"):
            sl = r.get_slice(key)
            for _ in range(300):
                index = random_index(rng, arrays[key].shape)
                want = arrays[key][index]
                got = sl[index]
                assert got.shape == want.shape, (key, index)
                assert got.dtype == want.dtype
                assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (key, index)
        s = r.get_slice("scalar")
        assert s.shape == () and s[...] == 2.5 and s[()] == 2.5 and s[...].shape == ()


def test_get_slice_shape_and_dtype_as_safetensors(tmp_path, arrays):
    plain = {k: v for k, v in arrays.items() if k != "bf16"}
    safetensors_numpy.save_file(plain, str(tmp_path / "st.safetensors"))
    sp.save_file(arrays, tmp_path / "ck", durable=False)
    with sp.open(tmp_path / "ck") as r, safe_open(str(tmp_path / "st.safetensors"), "np") as f:
        for key in plain:
            ours, theirs = r.get_slice(key), f.get_slice(key)
            assert ours.get_shape() == theirs.get_shape()
            assert ours.get_dtype() == theirs.get_dtype()
            assert ours.shape == arrays[key].shape and ours.dtype == arrays[key].dtype
        assert r.get_slice("bf16").get_dtype() == "BF16"
        assert r.get_slice("bf16").dtype == np.dtype(ml_dtypes.bfloat16)


# (index, also rejected by safetensors?) — out of range and unsupported kinds
BAD = [
    (37, True),
    (-38, True),
    (slice(0, 40), True),
    (slice(30, 38), True),
    ((slice(None), slice(0, 30)), True),
    ((0, 0, 0, 0), True),
    ([0, 1], True),
    ([0], True),
    ((1, []), True),
    (None, True),
    (1.0, True),
    ((Ellipsis, Ellipsis), True),
    (slice(None, None, 0), True),
    (slice(-40, 2), False),  # safetensors: OverflowError for any negative bound
    (True, False),  # safetensors reads True as 1; numpy as a mask: refused, ambiguous
]


@pytest.mark.parametrize("index,peer_raises", BAD, ids=[repr(b[0]) for b in BAD])
def test_get_slice_refuses_like_safetensors(tmp_path, arrays, index, peer_raises):
    cube = arrays["cube"]
    safetensors_numpy.save_file({"cube": cube}, str(tmp_path / "st.safetensors"))
    sp.save_file({"cube": cube}, tmp_path / "ck", durable=False)
    with sp.open(tmp_path / "ck") as r:
        with pytest.raises(InvalidSliceError) as info:
            r.get_slice("cube")[index]
    assert isinstance(info.value, IndexError)  # numpy's class for out-of-range indices
    assert "'cube'" in str(info.value) and "[37, 29, 11]" in str(info.value)
    with safe_open(str(tmp_path / "st.safetensors"), "np") as f:
        if peer_raises:
            with pytest.raises(Exception):  # noqa: B017 - SafetensorError or OverflowError
                f.get_slice("cube")[index]


def test_get_slice_lists_and_empty_selections_as_safetensors(tmp_path, arrays):
    cube = arrays["cube"]
    safetensors_numpy.save_file({"cube": cube}, str(tmp_path / "st.safetensors"))
    sp.save_file({"cube": cube}, tmp_path / "ck", durable=False)
    with sp.open(tmp_path / "ck") as r, safe_open(str(tmp_path / "st.safetensors"), "np") as f:
        for index in ([], slice(1, 1), (slice(None), slice(3, 3))):
            assert r.get_slice("cube")[index].shape == f.get_slice("cube")[index].shape
        # start > stop: empty as in numpy (safetensors 0.8 crashes with a SystemError)
        assert r.get_slice("cube")[0, 5:2].shape == cube[0, 5:2].shape == (0, 11)
        # safetensors refuses [n:n]; numpy (and we) return an empty selection there
        assert r.get_slice("cube")[37:37].shape == (0, 29, 11)


def test_get_slice_refuses_non_tensors_and_keeps_reader_slice(tmp_path):
    sp.save_file({"t": np.arange(10.0), "s": "text"}, tmp_path / "ck", durable=False)
    with sp.open(tmp_path / "ck") as r:
        with pytest.raises(InvalidArgumentError, match="'s'"):
            r.get_slice("s")
        with pytest.raises(KeyError):
            r.get_slice("missing")
        # Reader.slice keeps its clipping contract
        assert np.array_equal(r.slice("t", 5, 100), np.arange(5.0, 10.0))


def _corrupt_middle(prefix, key) -> None:
    with sp.open(prefix) as r:
        info = r.info(key)
        shard = r.format_info["shards"][info.shard][0]
    with open(shard, "r+b") as fh:
        fh.seek(info.offset + info.stored_bytes // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_compressed_get_slice_decodes_only_the_chunks_it_needs(tmp_path):
    """One chunk is damaged: every selection that avoids it reads fine (its chunk is never
    decoded), every selection touching it raises ChecksumMismatchError."""
    rows = np.cumsum(np.ones((256, 1024), dtype=np.float32), axis=1)  # 4 KiB rows, compressible
    p = tmp_path / "ck"
    sp.save_file({"w": rows}, p, compression="zstd", chunk_bytes=4096, durable=False)
    _corrupt_middle(p, "w")
    with sp.open(p) as r:
        sl = r.get_slice("w")
        bad = [i for i in range(256) if _fails(lambda i=i: sl[i])]
        assert len(bad) == 1, bad  # one 4 KiB chunk = one row
        (k,) = bad
        assert np.array_equal(sl[:k], rows[:k])
        assert np.array_equal(sl[k + 1 :, 100:900:7], rows[k + 1 :, 100:900:7])
        assert np.array_equal(sl[-1:k:-3], rows[-1:k:-3])
        with pytest.raises(ChecksumMismatchError):
            sl[:, 5]  # a column needs every row's chunk
        with pytest.raises(ChecksumMismatchError):
            sl[k - 1 : k + 1]


def _fails(fn) -> bool:
    try:
        fn()
    except ChecksumMismatchError:
        return True
    return False


def _resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache (mincore on a fresh read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    raw = np.frombuffer(mm, dtype=np.uint8)
    try:
        if libc.mincore(raw.__array_interface__["data"][0], size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
    finally:
        del raw
        mm.close()
    return sum(v & 1 for v in vec)


def test_uncompressed_get_slice_reads_only_the_pages_it_selects(tmp_path):
    """The shard is evicted from the page cache, then a few rows and columns are read: only
    pages near them come back into the cache (the kernel's readahead window included, 8 MiB on
    some machines), not the 128 MiB tensor."""
    w = np.arange(8192 * 4096, dtype=np.float32).reshape(8192, 4096)  # 16 KiB rows
    p = tmp_path / "ck"
    sp.save_file({"w": w}, p, compression="none", durable=True)
    # verify=False: by default the first read of an uncompressed value checks its crc32c, which
    # covers the whole value (issue 12); page-level laziness is what the opt-out buys
    with sp.open(p, verify=False) as r:
        shard = r.format_info["shards"][0][0]
        total = _resident_pages(shard)
        evict(shard)
        if _resident_pages(shard) > total // 8:
            pytest.skip("this filesystem keeps the file cached after POSIX_FADV_DONTNEED (tmpfs?)")
        got = r.get_slice("w")[4000:4003, 100:300:2]
        after = _resident_pages(shard)
    assert np.array_equal(got, w[4000:4003, 100:300:2])
    assert after < total // 4, (after, total)  # well under 32 of the 128 MiB came back
