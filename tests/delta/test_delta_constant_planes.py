"""Constant byte planes of zstd-bytegroup chunks (all zero in most planes of a delta payload)
are written as hand-built zstd frames of RLE blocks, without a zstd pass (rust/src/codec/
zstd_rle.rs). Any zstd decoder reads them: checked through ``encode``/``apply`` bit for bit on
every group width (2, 4, 8; complex128's 16-byte elements as 8-byte halves) across chunk
boundaries, through the pure-Python reference reader, and a damaged frame is refused. Dense
planes of an XOR payload are zstd frames of Huffman-coded literals (rust/src/codec/
zstd_setup.rs): read back by both readers too."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.delta.bits import byte_view
from shardpoint.errors import CheckpointError
from shardpoint.storage.dtypes import numpy_dtype

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import reference_reader as rr  # noqa: E402
import reference_reader_delta as rd  # noqa: E402

CHUNK = 1 << 20
DTYPES = ["bfloat16", "float16", "int16", "float32", "int32", "float64", "int64", "complex128"]


def _pair(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(old, new) of dtype ``name`` over a chunk and a bit (a partial second chunk): ``new``
    has its lowest byte flipped in every 50th element, so every other plane of the XOR is all
    zero, and the lowest plane is constant in the short tail."""
    dt = numpy_dtype(name)
    n = CHUNK // dt.itemsize + 33
    raw = np.random.default_rng(seed).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    old = raw.view(dt)
    nb = raw.copy()
    nb[:: 50 * dt.itemsize] ^= 0x5A
    return old, nb.view(dt)


@pytest.mark.parametrize("name", DTYPES)
def test_sparse_and_unchanged_keys_round_trip_bit_exact(name: str) -> None:
    old, new = _pair(name, 1)
    zero_old = np.zeros_like(old)  # XOR with a constant: every plane constant
    const_new = byte_view(zero_old).copy()
    const_new[:] = 0x11
    olds = {"w": old, "same": old.copy(), "const": zero_old}
    news = {"w": new, "same": old.copy(), "const": const_new.view(old.dtype)}
    blob = spd.encode(olds, news)
    assert blob is not None
    # an unchanged key costs a few frames per chunk, not its size
    assert len(blob) < new.nbytes // 2
    target = {k: v.copy() for k, v in olds.items()}
    counts = spd.apply(blob, target)
    assert counts["same"] == 1 and counts["xor"] + counts["full"] == 2
    for k in news:
        assert byte_view(target[k]).tobytes() == byte_view(news[k]).tobytes(), k


def test_reference_reader_reads_constant_planes(tmp_path: object) -> None:
    """A saved XOR-like value with all-zero and constant planes reads the same through the
    reference reader (its zstd frames counted as compressed planes) and the library."""
    old, new = _pair("float32", 2)
    x = (byte_view(old) ^ byte_view(new)).view(np.float32)
    ones = np.full(CHUNK // 4 + 5, np.float32(1.0))  # every plane constant
    p = os.path.join(str(tmp_path), "c")
    sp.save_file({"x": x, "ones": ones}, p, compression="zstd-bytegroup", durable=False)
    ck = rr.read_checkpoint(p)
    for key, want in (("x", x), ("ones", ones)):
        assert ck.raw[key] == want.tobytes(), key
        assert ck.entries[key].planes_compressed >= 4, key
    got = sp.load_file(p)
    assert got["x"].tobytes() == x.tobytes() and got["ones"].tobytes() == ones.tobytes()
    # stored as frames of a few bytes: a chunk of `ones` is 4 planes of ~30 bytes
    with sp.open(p) as r:
        assert r.info("ones").stored_bytes < 400


def test_a_damaged_rle_frame_is_refused(tmp_path: object) -> None:
    ones = np.full(CHUNK // 4, np.float32(1.0))
    p = os.path.join(str(tmp_path), "d")
    sp.save_file({"ones": ones}, p, compression="zstd-bytegroup", durable=False)
    (shard,) = [f for f in os.listdir(str(tmp_path)) if ".data-" in f]
    path = os.path.join(str(tmp_path), shard)
    data = bytearray(open(path, "rb").read())
    at = data.find(bytes([0x28, 0xB5, 0x2F, 0xFD, 0xA0]))  # the first plane's frame
    assert at > 0
    data[at + 5] ^= 0x01  # its content size: one byte off
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="ones|d.data"):
        sp.load_file(p)


def test_dense_xor_planes_read_back_through_both_readers(tmp_path: object) -> None:
    """An RL-like bf16 step: the low plane of the XOR ~20% nonzero (the literals-only setup),
    the high plane sparse (the matching one); a delta checkpoint of it reads back bit for bit
    through the library and the reference reader, and a sync delta applies exactly."""
    rng = np.random.default_rng(3)
    n = CHUNK + 4097  # a full chunk and a partial one
    old = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    new = old.copy()
    moved = rng.random(n) < 0.2
    new[moved] ^= rng.integers(1, 128, int(moved.sum()), dtype=np.uint16)  # low bits only
    new[::997] ^= 0x0100  # and a few exponent-plane bytes
    bf = numpy_dtype("bfloat16")
    olds, news = {"w": old.view(bf)}, {"w": new.view(bf)}
    d = str(tmp_path)
    base, delta = os.path.join(d, "b"), os.path.join(d, "d")
    sp.save_file(olds, base, durable=False)
    sp.save_file(news, delta, base=base, delta=True, durable=False)
    assert spd.describe(delta)["tensors"]["w"]["mode"] == "xor"
    assert sp.load_file(delta)["w"].tobytes() == new.tobytes()
    dtype, dims, raw = rd.read_resolved(delta)["w"]
    assert (dtype, list(dims), raw) == ("bfloat16", [n], new.tobytes())
    blob = spd.encode(olds, news)
    assert blob is not None and len(blob) < new.nbytes // 3
    target = {"w": old.view(bf).copy()}
    assert spd.apply(blob, target)["xor"] == 1
    assert target["w"].tobytes() == new.tobytes()
