"""The Rust writer's output, decoded by the independent reference reader (tests/reference_reader.py,
written from docs/FORMAT.md alone), must agree byte for byte with what was saved and with
``sp.load_file``. Also pins the reference reader itself (crc32c vectors, byte grouping, strictness)
so that a lenient reader cannot make these tests pass vacuously."""

from __future__ import annotations

import math
import os
import struct

import ml_dtypes
import numpy as np
import pytest

import reference_reader as rr
import shardpoint as sp

ALL_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
]
MULTI_BYTE = {d for d in ALL_DTYPES if rr.numpy_dtype(d).itemsize >= 2}


def np_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def le_bytes(a: np.ndarray) -> bytes:
    """The raw bytes the format stores for array ``a``: C order, little-endian."""
    dt = a.dtype
    if dt.byteorder == ">":
        a = a.astype(dt.newbyteorder("<"))
    return np.ascontiguousarray(a).tobytes()


def make_array(
    dtype: str, shape: tuple[int, ...], rng: np.random.Generator, style: str
) -> np.ndarray:
    """Values of ``dtype``: 'smooth' compresses (after byte grouping), 'noise' does not."""
    n = math.prod(shape)
    dt = np_dtype(dtype)
    if dtype == "bool":
        return (rng.random(n) < (0.1 if style == "smooth" else 0.5)).reshape(shape)
    if style == "noise":
        return np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt).reshape(shape).copy()
    if dtype.startswith("complex"):
        re_ = rng.standard_normal(n)
        return (re_ + 1j * np.round(re_, 1)).astype(dt).reshape(shape)
    if dt.kind == "f" or dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return (rng.standard_normal(n) * 0.02).astype(np.float32).astype(dt).reshape(shape)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(lo, hi + 1, n).astype(dt).reshape(shape)


def assert_same(saved: object, ref: object, loaded: object, key: str) -> None:
    if isinstance(saved, np.ndarray):
        assert isinstance(ref, np.ndarray) and isinstance(loaded, np.ndarray), key
        assert ref.dtype == np_dtype(saved.dtype.name) or ref.dtype == saved.dtype.newbyteorder(
            "<"
        ), key
        assert ref.shape == saved.shape, (key, ref.shape, saved.shape)
        assert loaded.shape == saved.shape, (key, loaded.shape, saved.shape)
        assert ref.dtype.itemsize == loaded.dtype.itemsize and ref.dtype.name == loaded.dtype.name
        want = le_bytes(saved)
        assert ref.tobytes() == want, key
        assert loaded.tobytes() == want, key
    elif isinstance(saved, float) and math.isnan(saved):
        assert isinstance(ref, float) and math.isnan(ref) and math.isnan(loaded), key
    else:
        want = list(saved) if isinstance(saved, tuple) else saved
        assert ref == want and type(ref) is type(want), (key, ref, want)
        assert loaded == want and type(loaded) is type(want), (key, loaded, want)


def check_checkpoint(prefix: str, saved: dict, metadata: dict | None = None) -> rr.Checkpoint:
    ck = rr.read_checkpoint(prefix)
    loaded = sp.load_file(prefix)
    assert sorted(ck.values) == sorted(saved) == sorted(loaded)
    for k, v in saved.items():
        assert_same(v, ck.values[k], loaded[k], k)
        assert ck.entries[k].crc == rr.crc32c(ck.raw[k])
    assert ck.user_metadata == (metadata or {})
    with sp.open(prefix) as r:
        assert r.metadata == (metadata or {})
        for k in saved:
            info = r.info(k)
            e = ck.entries[k]
            assert (info.dtype, info.codec, info.kind) == (e.dtype, e.codec, e.kind), k
            assert (info.offset, info.stored_bytes, info.raw_bytes) == (
                e.offset,
                e.stored_len,
                e.raw_len,
            )
            assert (info.crc32c, info.shard, info.chunks) == (e.crc, e.shard, len(e.chunks)), k
    return ck


# ---- the reference reader's own primitives ---------------------------------------------------


def test_crc32c_known_vectors() -> None:
    # RFC 3720 B.4 and the usual check value.
    assert rr.crc32c(b"123456789") == 0xE3069283
    assert rr.crc32c(bytes(32)) == 0x8A9136AA
    assert rr.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert rr.crc32c(bytes(range(32))) == 0x46DD794E
    assert rr.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    assert rr.crc32c(b"") == 0


@pytest.mark.parametrize("n", [16383, 16384, 16385, 65537, 300_001])
def test_crc32c_lane_path_matches_bytewise(n: int) -> None:
    data = np.random.default_rng(n).bytes(n)
    assert rr.crc32c(data) == rr._update_py(0xFFFFFFFF, data) ^ 0xFFFFFFFF


def test_byte_group_pins_rotation_and_plane_order() -> None:
    # bf16 1.0 = 0x3f80 -> rotl 0x7f00 -> planes (msb first) [0x7f], [0x00]
    assert rr.byte_group("bfloat16", struct.pack("<H", 0x3F80)) == bytes([0x7F, 0x00])
    assert rr.byte_group("bfloat16", struct.pack("<H", 0xBF80)) == bytes([0x7F, 0x01])
    # float32 1.0, -2.0: 0x3f800000 -> 0x7f000000, 0xc0000000 -> 0x80000001
    g = rr.byte_group("float32", struct.pack("<2I", 0x3F800000, 0xC0000000))
    assert g == bytes([0x7F, 0x80, 0, 0, 0, 0, 0, 0x01])
    # integers are not rotated: plane 0 is the most significant byte
    g = rr.byte_group("int32", struct.pack("<2I", 0x01020304, 0x0A0B0C0D))
    assert g == bytes([0x01, 0x0A, 0x02, 0x0B, 0x03, 0x0C, 0x04, 0x0D])
    # complex64 = pairs of float32 components, each rotated
    g = rr.byte_group("complex64", np.array([1 - 2j], dtype="<c8").tobytes())
    assert g == bytes([0x7F, 0x80, 0, 0, 0, 0, 0, 0x01])
    rng = np.random.default_rng(1)
    for d in ALL_DTYPES:
        raw = rng.bytes(48 * rr.numpy_dtype(d).itemsize)
        assert rr.byte_ungroup(d, rr.byte_group(d, raw)) == raw, d


def test_reference_reader_is_strict(tmp_path) -> None:
    """Damage anywhere in the index or a shard must be refused by the reference reader."""
    p = str(tmp_path / "ck")
    rng = np.random.default_rng(2)
    vals = {f"k{i:03d}": make_array("float32", (2000,), rng, "smooth") for i in range(70)}
    sp.save_file(vals, p, durable=False, chunk_bytes=4096)
    rr.read_checkpoint(p)
    idx = open(p + ".index", "rb").read()
    shard_path = p + ".data-00000-of-00001"
    shard = open(shard_path, "rb").read()
    h = {
        name: struct.unpack_from("<Q", idx, at)[0]
        for name, at in [("blocks", 48), ("entries", 56), ("keys", 64), ("aux", 80), ("meta", 96)]
    }
    spots = [
        0,
        9,
        13,
        20,
        37,
        45,
        130,
        h["blocks"] + 3,
        h["entries"] + 6,
        h["entries"] + 41,
        h["keys"] + 2,
        h["aux"] + 5,
        h["meta"] + 1,
        len(idx) - 10,
        len(idx) - 2,
    ]
    for at in spots:
        bad = bytearray(idx)
        bad[at] ^= 0x20
        open(p + ".index", "wb").write(bad)
        with pytest.raises(rr.FormatError) as ei:
            rr.read_checkpoint(p)
        assert p in str(ei.value)
    open(p + ".index", "wb").write(idx)
    for at in [3, 17, 40, 70, 5000, len(shard) - 1]:
        bad = bytearray(shard)
        bad[at] ^= 0x01
        open(shard_path, "wb").write(bad)
        with pytest.raises(rr.FormatError, match="data-00000"):
            rr.read_checkpoint(p)
    open(shard_path, "wb").write(shard + b"\0")
    with pytest.raises(rr.FormatError, match="index records"):
        rr.read_checkpoint(p)
    open(shard_path, "wb").write(shard)
    rr.read_checkpoint(p)


# ---- the Rust writer against the reference reader --------------------------------------------

SHAPES = [(1,), (7,), (0,), (3, 0), (5000,), (33, 65), (2, 3, 4, 5), (4097,)]


ROTATED = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}


def expected_codec(compression: str, dtype: str) -> str:
    """§5: the codec a compressed entry of `dtype` carries under each compression name."""
    if compression == "zstd-plain" or dtype not in MULTI_BYTE:
        return "zstd"
    if compression == "zstd" and dtype in ROTATED:
        return "bytegroup-huffman"
    return "zstd-bytegroup"


@pytest.mark.parametrize("compression", ["none", "zstd", "zstd-plain", "zstd-bytegroup"])
@pytest.mark.parametrize("shards", [1, 3])
def test_all_dtypes_shapes_codecs(tmp_path, compression: str, shards: int) -> None:
    rng = np.random.default_rng([len(compression), shards])
    saved: dict = {}
    for d in ALL_DTYPES:
        for j, shape in enumerate(SHAPES):
            saved[f"{d}/{j}/smooth"] = make_array(d, shape, rng, "smooth")
        saved[f"{d}/noise"] = make_array(d, (3000,), rng, "noise")
        # mostly compressible with one incompressible stretch: mixed raw/compressed chunks
        mixed = make_array(d, (12000,), rng, "smooth")
        mixed.reshape(-1)[4000:6500] = make_array(d, (2500,), rng, "noise")
        saved[f"{d}/mixed"] = mixed
    p = str(tmp_path / "ck")
    sp.save_file(
        saved,
        p,
        compression=compression,
        shards=shards,
        chunk_bytes=4096,
        durable=False,
        metadata={"run": compression, "n": [1, 2.5, None]},
    )
    ck = check_checkpoint(p, saved, {"run": compression, "n": [1, 2.5, None]})
    assert len(ck.shards) == shards
    codecs = {e.codec for e in ck.entries.values()}
    if compression == "none":
        assert codecs == {"none"}
        return
    # The compressed paths were actually exercised.
    assert {expected_codec(compression, d) for d in ALL_DTYPES} <= codecs
    for k, e in ck.entries.items():
        d = k.split("/")[0]
        if e.codec != "none":
            assert e.codec == expected_codec(compression, d), k
    assert any(0 < e.chunks_stored_raw < len(e.chunks) for e in ck.entries.values())
    cb = ck.chunk_bytes
    for e in ck.entries.values():
        for c, (_, sl, _) in enumerate(e.chunks):
            raw_n = min(cb, e.raw_len - c * cb)
            assert sl == raw_n or sl * 100 < raw_n * 95, (e.key, c)  # §5: saves >= 5% or raw
    if compression in ("zstd", "zstd-bytegroup"):
        # plane segments of both kinds (zstd frame, raw plane) were decoded
        assert any(e.planes_compressed and e.planes_raw for e in ck.entries.values())
    if compression == "zstd":
        # bytegroup-huffman: Huffman-coded, constant and raw planes were all decoded
        assert any(e.planes_huffman and e.planes_raw for e in ck.entries.values())
        assert any(e.planes_constant for e in ck.entries.values())
    assert sum(len(e.chunks) > 1 for e in ck.entries.values()) > 10


def test_non_contiguous_big_endian_inputs(tmp_path) -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 30))
    saved = {
        "be/f64": base.astype(">f8"),
        "be/i32/strided": (base * 100).astype(">i4")[::3, 1::2],
        "fortran": np.asfortranarray(base.astype(np.float32)),
        "transposed/c128": (base + 1j * base).T,
        "neg-stride": base.astype(np.float16)[::-1, ::-2],
        "be/u16": np.arange(5000, dtype=">u2"),
    }
    p = str(tmp_path / "ck")
    sp.save_file(saved, p, durable=False, chunk_bytes=4096)
    check_checkpoint(p, saved)


def test_zero_dim_entries_have_ndim_0(tmp_path) -> None:
    """0-d arrays are stored with ndim 0 (no dims in aux) and come back 0-d (numpy scalars are
    object entries, FORMAT.md §6.1)."""
    saved = {
        "f64": np.array(2.5),
        "i8": np.array(np.int8(-3)),
        "bool": np.array(np.bool_(True)),
        "c64": np.array(np.complex64(1j)),
    }
    p = str(tmp_path / "ck")
    sp.save_file(saved, p, durable=False)
    ck = rr.read_checkpoint(p)
    for k, v in saved.items():
        e = ck.entries[k]
        assert e.dims == (), (k, e.dims)
        assert ck.values[k].shape == () and ck.raw[k] == np.asarray(v).tobytes()
    check_checkpoint(p, {k: np.asarray(v) for k, v in saved.items()})


def test_typed_values(tmp_path) -> None:
    saved = {
        "bytes": b"\x00\xffabc",
        "bytes/empty": b"",
        "str": "héllo wörld ✓ 日本",
        "str/empty": "",
        "int": -12345678901234567890123456789,
        "int/zero": 0,
        "int/huge": -(7**6000),  # past Python's 4300-digit str() limit: written as -0x...
        "float": 0.1,
        "float/neg-inf": float("-inf"),
        "float/nan": float("nan"),
        "float/tiny": 5e-324,
        "json/dict": {"a": [1, 2, {"b": None}], "c": "x"},
        "json/list": [1, "two", 3.0],
        "json/true": True,
        "json/false": False,
        "json/null": None,
    }
    p = str(tmp_path / "ck")
    sp.save_file(saved, p, durable=False)
    ck = check_checkpoint(p, saved)
    kinds = {k: e.kind for k, e in ck.entries.items()}
    assert kinds["bytes"] == "bytes" and kinds["str"] == "str" and kinds["int"] == "int"
    assert (
        kinds["float"] == "float" and kinds["json/true"] == "json" and kinds["json/null"] == "json"
    )
    assert ck.raw["int"] == b"-12345678901234567890123456789"
    assert ck.raw["int/huge"] == b"-" + hex(7**6000).encode()
    assert ck.raw["float"] == b"0.1" and ck.raw["float/nan"] == b"nan"
    assert ck.raw["json/true"] == b"true" and ck.raw["json/null"] == b"null"
    for e in ck.entries.values():
        assert e.dtype == "uint8" and len(e.dims) == 1
        assert e.dims_inline == (e.codec == "none")  # §3.3: no dims in aux for raw 1-d
    assert ck.entries["int/huge"].codec == "zstd"  # typed values are compressed like tensors


def test_many_blocks_unicode_keys_and_tokened_shards(tmp_path) -> None:
    """> 64 entries (several index blocks), non-ASCII keys sorted by UTF-8 bytes, and a save over
    an existing checkpoint (shard names then carry the save token)."""
    rng = np.random.default_rng(4)
    keys = [f"层/{i:03d}/ключ" for i in range(80)] + [f"net/l{i}/kernel/é" for i in range(60)]
    keys += ["\U0001f600", "z", "Z", "é", "e\u0301", "a" * 3000]
    saved = {k: make_array("float32", (int(rng.integers(0, 300)),), rng, "smooth") for k in keys}
    p = str(tmp_path / "ck")
    sp.save_file(saved, p, durable=False, shards=2)
    check_checkpoint(p, saved)
    with sp.open(p) as r:
        assert r.keys() == sorted(saved, key=lambda k: k.encode())
        r2 = {k: v * 2 for k, v in saved.items()}
        sp.save_file(r2, p, durable=False, shards=2, compression="none")
        assert np.array_equal(r[keys[0]], saved[keys[0]])
    ck = check_checkpoint(p, r2)
    assert all(len(s.name) == len(".data-00000-of-00002.") + 16 for s in ck.shards)


def test_multi_writer_merge(tmp_path) -> None:
    p = str(tmp_path / "ck")
    rng = np.random.default_rng(5)
    saved: dict = {}
    for rank in range(3):
        w = sp.Writer(
            p,
            rank=rank,
            world_size=3,
            shards=2,
            durable=False,
            chunk_bytes=4096,
            metadata={"rank0": True} if rank == 0 else {"other": rank},
        )
        for i in range(30):
            k = f"r{rank}/t{i}"
            saved[k] = make_array(
                ALL_DTYPES[(i + rank) % len(ALL_DTYPES)], (i * 97,), rng, "smooth"
            )
            w.add(k, saved[k])
        w.add(f"r{rank}/step", rank * 10)
        saved[f"r{rank}/step"] = rank * 10
        w.commit()
    sp.merge(p, 3, durable=False)
    ck = check_checkpoint(p, saved, {"rank0": True})
    assert len(ck.shards) == 6
    assert ck.metadata["format"] == 1 and "partial" not in ck.metadata


def test_large_multichunk_default_chunk_size(tmp_path) -> None:
    rng = np.random.default_rng(6)
    saved = {
        "w": (rng.standard_normal((1100, 1000)) * 0.05).astype(np.float32),
        "b": (rng.standard_normal(700_000) * 0.05).astype(ml_dtypes.bfloat16),
    }
    p = str(tmp_path / "ck")
    sp.save_file(saved, p, durable=False)
    ck = check_checkpoint(p, saved)
    e = ck.entries["w"]
    assert (
        e.codec == "bytegroup-huffman"
        and len(e.chunks) == math.ceil(e.raw_len / ck.chunk_bytes) > 1
    )
    assert e.offset % 64 == 0  # §2: compressed payloads need no page alignment


def test_reference_reader_refuses_newer_version(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"a": np.arange(3)}, p, durable=False)
    b = bytearray(open(p + ".index", "rb").read())
    b[8:12] = struct.pack("<I", 3)  # 2 is known: hashed shard names (§3.1.1)
    c = rr.crc32c(bytes(b[:124]))
    b[124:128] = struct.pack("<I", c)
    b[-8:-4] = struct.pack("<I", c)
    open(p + ".index", "wb").write(b)
    with pytest.raises(rr.FormatError, match="format_version 3"):
        rr.read_checkpoint(p)
    with pytest.raises(sp.UnsupportedFormatError):
        sp.load_file(p)


def test_index_layout_has_no_gaps(tmp_path) -> None:
    """The writer packs the index sections back to back from offset 128 (the spec allows gaps;
    this pins what the v1 writer does so the golden files stay reproducible)."""
    p = str(tmp_path / "ck")
    sp.save_file({f"k{i}": np.arange(i, dtype=np.int16) for i in range(100)}, p, durable=False)
    b = open(p + ".index", "rb").read()
    q = struct.unpack_from("<QQIIQQQQQQQQQ", b, 16)
    file_len, n, nshards = q[0], q[1], q[2]
    (
        shards_off,
        blocks_off,
        entries_off,
        keys_off,
        keys_len,
        aux_off,
        aux_len,
        meta_off,
        meta_len,
    ) = q[4:]
    assert shards_off == 128 and blocks_off == 128 + 64 * nshards
    assert entries_off == blocks_off + 24 * math.ceil(n / 64) and keys_off == entries_off + 40 * n
    assert aux_off == keys_off + keys_len and meta_off == aux_off + aux_len
    assert file_len == meta_off + meta_len + 16 == os.path.getsize(p + ".index")


def test_str_values_are_utf8(tmp_path) -> None:
    """FORMAT.md §6: a str payload is UTF-8. A str that has no UTF-8 encoding (a lone surrogate)
    must be refused at save time, not written as bytes that no conforming reader decodes."""
    p = str(tmp_path / "ck")
    try:
        sp.save_file({"s": "lone \udc80 surrogate"}, p, durable=False)
    except sp.CheckpointError:
        assert not sp.exists(p)
        return
    rr.read_checkpoint(p)  # raises FormatError: 'str value is not UTF-8'
