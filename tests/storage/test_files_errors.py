"""Every error case of the Python file API (open, load_file, save_file, Reader): missing and
truncated files, bit flips in payloads, chunks and the index, wrong magic and newer versions,
bad keys and dtypes, each with its exception class and a message naming the file, key or
offset."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import reference_reader as rr
import shardpoint as sp
from shardpoint.testing import assert_identical


def _ckpt_values() -> dict:
    rng = np.random.default_rng(11)
    return {
        "raw": np.arange(3000, dtype=np.int64),
        "packed": (rng.standard_normal(30000) * 0.01).astype(np.float32),
        "step": 7,
    }


@pytest.fixture
def ckpt(tmp_path) -> str:
    """A two-shard checkpoint with a raw and a compressed tensor and a typed value."""
    p = str(tmp_path / "ck")
    sp.save_file(_ckpt_values(), p, shards=2, chunk_bytes=4096, durable=False)
    return p


def _shard_of(prefix: str, key: str) -> str:
    with sp.open(prefix) as r:
        return r.format_info["shards"][r.info(key).shard][0]


def _flip(path: str, at: int, bit: int = 0x10) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ bit]))


def test_missing_checkpoint(tmp_path) -> None:
    p = str(tmp_path / "nope")
    for call in (lambda: sp.load_file(p), lambda: sp.open(p)):
        with pytest.raises(sp.NotFoundError, match="nope.index") as ei:
            call()
        assert isinstance(ei.value, FileNotFoundError)


def test_missing_shard(ckpt) -> None:
    shard = _shard_of(ckpt, "packed")
    os.unlink(shard)
    with pytest.raises(sp.NotFoundError, match=os.path.basename(shard)) as ei:
        sp.load_file(ckpt)
    assert isinstance(ei.value, FileNotFoundError)


def test_truncated_shard(ckpt) -> None:
    shard = _shard_of(ckpt, "packed")
    size = os.path.getsize(shard)
    os.truncate(shard, size - 100)
    with pytest.raises(
        sp.CorruptCheckpointError, match=rf"{os.path.basename(shard)}.*offset"
    ) as ei:
        sp.open(ckpt)
    assert "truncated" in str(ei.value) and isinstance(ei.value, ValueError)


def test_truncated_index(ckpt) -> None:
    idx = ckpt + ".index"
    data = open(idx, "rb").read()
    for n in (len(data) - 1, len(data) // 2, 100, 0):
        open(idx, "wb").write(data[:n])
        with pytest.raises(sp.CorruptCheckpointError, match=r"ck\.index"):
            sp.load_file(ckpt)


def test_bit_flip_in_raw_payload(ckpt) -> None:
    with sp.open(ckpt) as r:
        info = r.info("raw")
    shard = _shard_of(ckpt, "raw")
    _flip(shard, info.offset + 123)
    with pytest.raises(
        sp.ChecksumMismatchError, match=rf"{os.path.basename(shard)}.*offset {info.offset}.*\"raw\""
    ):
        sp.load_file(ckpt)
    with sp.open(ckpt) as r:
        with pytest.raises(sp.ChecksumMismatchError, match='"raw"'):
            r.verify()
        assert r["step"] == 7  # other keys still read


def test_bit_flip_in_compressed_chunk(ckpt) -> None:
    with sp.open(ckpt) as r:
        info = r.info("packed")
        assert info.codec == "bytegroup-huffman" and info.chunks > 3
        ref = rr.read_index(ckpt)["packed"]
    rel = ref.chunks[2][0]
    shard = _shard_of(ckpt, "packed")
    _flip(shard, info.offset + rel + 5)
    with pytest.raises(
        sp.ChecksumMismatchError, match=rf"offset {info.offset + rel}.*\"packed\" chunk 2"
    ):
        sp.load_file(ckpt, keys=["packed"])
    with sp.open(ckpt) as r:
        with pytest.raises(sp.ChecksumMismatchError, match="chunk 2"):
            r["packed"]
        with pytest.raises(sp.ChecksumMismatchError):
            r.verify()
        # a slice that does not touch chunk 2 still reads
        assert_identical(_ckpt_values()["packed"][:1000], r.slice("packed", 0, 1000))


@pytest.mark.parametrize(
    "where", ["header", "shard table", "entries", "keys", "metadata", "footer"]
)
def test_bit_flip_in_index(ckpt, where: str) -> None:
    idx = ckpt + ".index"
    b = open(idx, "rb").read()
    offs = {
        "header": 20,
        "shard table": struct.unpack_from("<Q", b, 40)[0] + 3,
        "entries": struct.unpack_from("<Q", b, 56)[0] + 30,
        "keys": struct.unpack_from("<Q", b, 64)[0] + 1,
        "metadata": struct.unpack_from("<Q", b, 96)[0] + 2,
        "footer": len(b) - 6,
    }
    _flip(idx, offs[where])
    with pytest.raises(sp.CorruptCheckpointError, match=r"ck\.index.*offset") as ei:
        with sp.open(ckpt) as r:
            r.load()
            r.metadata  # noqa: B018 - metadata is checked when first read
    if where != "footer":
        assert isinstance(ei.value, sp.ChecksumMismatchError)


def test_wrong_magic(ckpt) -> None:
    for path in (ckpt + ".index", _shard_of(ckpt, "raw")):
        data = open(path, "rb").read()
        open(path, "wb").write(b"NOTMAGIC" + data[8:])
        with pytest.raises(sp.CorruptCheckpointError, match=rf"{os.path.basename(path)}.*magic"):
            sp.load_file(ckpt)
        open(path, "wb").write(data)
    sp.load_file(ckpt)


def test_newer_format_version(ckpt) -> None:
    idx = ckpt + ".index"
    b = bytearray(open(idx, "rb").read())
    b[8:12] = struct.pack("<I", 3)  # 2 is known: hashed shard names (FORMAT.md §3.1.1)
    crc = rr.crc32c(bytes(b[:124]))
    b[124:128] = struct.pack("<I", crc)
    b[-8:-4] = struct.pack("<I", crc)  # the footer's copy of the header crc
    open(idx, "wb").write(b)
    with pytest.raises(sp.UnsupportedFormatError, match=r"ck\.index.*version 3") as ei:
        sp.load_file(ckpt)
    assert isinstance(ei.value, sp.CorruptCheckpointError)


def test_newer_shard_format_version(ckpt) -> None:
    shard = _shard_of(ckpt, "raw")
    b = bytearray(open(shard, "rb").read())
    b[8:12] = struct.pack("<I", 3)
    b[60:64] = struct.pack("<I", rr.crc32c(bytes(b[:60])))
    open(shard, "wb").write(b)
    with pytest.raises(sp.UnsupportedFormatError, match=rf"{os.path.basename(shard)}.*version 3"):
        sp.load_file(ckpt)


def test_missing_key(ckpt) -> None:
    with sp.open(ckpt) as r:
        with pytest.raises(KeyError, match="nope") as ei:
            r["nope"]
        assert isinstance(ei.value, sp.MissingKeyError) and "ck.index" in str(ei.value)
        assert r.get("nope") is None and r.get("nope", 5) == 5 and "nope" not in r
        with pytest.raises(sp.MissingKeyError):
            r.info("nope")
    with pytest.raises(KeyError, match="nope"):
        sp.load_file(ckpt, keys=["raw", "nope"])


@pytest.mark.parametrize("key", [1, 2.5, b"bytes", None, ("t",)])
def test_non_string_key(tmp_path, ckpt, key) -> None:
    with pytest.raises(sp.InvalidKeyError, match="str") as ei:
        sp.save_file({key: 1}, str(tmp_path / "x"), durable=False)
    assert isinstance(ei.value, TypeError) and not sp.exists(str(tmp_path / "x"))
    with sp.open(ckpt) as r:
        with pytest.raises(sp.InvalidKeyError):
            r[key]
        assert key not in r
    with pytest.raises(sp.InvalidKeyError):
        sp.Writer(str(tmp_path / "y"), durable=False).add(key, 1)


@pytest.mark.parametrize("key", ["", "a\x00b", "k" * 65536, "bad\udc80surrogate"])
def test_unstorable_string_key(tmp_path, key: str) -> None:
    """errors.py: InvalidKeyError is 'a key is not a non-empty string of at most 65535 UTF-8
    bytes without NUL'."""
    with pytest.raises(sp.InvalidKeyError):
        sp.save_file({key: 1}, str(tmp_path / "x"), durable=False)
    assert not sp.exists(str(tmp_path / "x"))


@pytest.mark.parametrize(
    "value",
    [
        np.array([1, "a"], dtype=object),
        np.array(["abc"]),
        np.array([b"abc"]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.array([5], dtype="timedelta64[s]"),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.zeros(2, dtype=np.longdouble)
        if np.dtype(np.longdouble).itemsize > 8
        else np.zeros(2, "V3"),
        object(),
        {1, object()},  # sets are stored (FORMAT.md §6.1), but not of opaque objects
    ],
    ids=lambda v: getattr(getattr(v, "dtype", None), "str", type(v).__name__),
)
def test_unsupported_dtype(tmp_path, value) -> None:
    p = str(tmp_path / "x")
    with pytest.raises(sp.UnsupportedDTypeError) as ei:
        sp.save_file({"bad/key": value}, p, durable=False)
    assert isinstance(ei.value, TypeError) and not sp.exists(p)
    assert os.listdir(tmp_path) == []
    assert "bad/key" in str(ei.value)  # the message names the key
    if isinstance(value, np.ndarray):
        assert str(value.dtype) in str(ei.value)
