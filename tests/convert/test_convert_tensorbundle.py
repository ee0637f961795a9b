"""TensorFlow checkpoints (TensorBundle) → shardpoint, without TensorFlow.

Two kinds of input:

- ``REAL_*``: a checkpoint written by TensorFlow 2.21 (``tf.train.Checkpoint(model=m).write``,
  tensorflow-cpu in a throwaway virtualenv; the script is in ``_REAL_SCRIPT``), embedded here
  zlib+base64 so the test needs no TensorFlow;
- ``build_bundle``: a TensorBundle built byte by byte from the documented formats (LevelDB table
  format + tensor_bundle.proto), with tiny blocks so the reader walks many blocks, restarts and
  prefix-compressed keys, two shards, and whatever corruption a test wants.

When tensorflow is installed, one more test writes a fresh checkpoint with it.
"""

from __future__ import annotations

import base64
import os
import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardpoint as sp
from shardpoint.convert import convert, detect_format
from shardpoint.convert.tensorbundle import (
    TABLE_MAGIC,
    TensorBundleReader,
    crc32c,
    mask_crc,
    unmask_crc,
)

_REAL_SCRIPT = """
m = tf.Module()
m.f32 = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) / 7)
... (one variable per entry of real_expected(), same values)
path = tf.train.Checkpoint(model=m).write(os.path.join(os.getcwd(), "real"))
"""

REAL_INDEX = (
    "eNpjYGDjYJRi4mBkkOGPd/ZwdfYO8Pf0C3F08nGN93fycnUOiXcPcgzw4GAXYlB4waixlNP0s0rvfAYlwdz8lNQc/SR9"
    "PceQkCBPp9AQ12D9MMcgT7DWMEefUFcOLiEWISYOZoUMDWbT0siJbOxygmmGZvh08IF1sChka3CYvp+Z+JZNTijZzASf"
    "Dg6wDiaFFkYNAdPtneu3sykIpeYWlFTi08QoxCbEAHbaDEbTG6+aFrHJiRJwmbAQB8gesF3FQNetLHm/nl1W2NgIvz0g"
    "TcwgL2kYmK7qNj7PLiuI3z9M0DAz0JAw3bfLfyUwBDLxu4wVGgINjBospkK17u/ZZUXxO4sZyS8ewGDzSHq0lKDDOKHW"
    "RAA11HnPPMcuI2iBTz0bVH2dBpOptml7DpuyWF5qcUlqin454SADaWUFRo5GgGmkCVMLmyJfcXJiTmIRfp0MClNAYeDB"
    "8H4dm6xgKV7nsUDDuRqYNosll2cwAAEjiHiVpOYE5xz4tHADAyNzHsNENrgYw6z/r6excSxm42cgCMJ/N3SrlLrfBgD6"
    "dMiM"
)
REAL_DATA = (
    "eNqtlD9s00AUxu/sJrm4tEVPHaBboYFQ0VpAsTyALw41xaVTScPAgJLUlSwlBfWPqoohmcoesSMQeze6tHFWdrbOzEiw"
    "IFWq+Wp3YbGF5JNO79333vvd853OjDFWcskquX3rqHMKS3Lz1JBHnVeSsZ6ELt3+F2hfZX/mG7SL8efSKsNrc4u1s+li"
    "hWN1HoahCgvTjcIQz8J4cMZ7kgVupbvEzOuTbBi+Y2Gh1/1+fpdf7IPsCmYPZshYuQo32B/zgt9Ty0G7rAc/Hk4GJwe/"
    "Boefjgefjw8G5cPpgfHh5QnmY/gWNAsxCzkWciVqJGolGNF3fCwu//QfaRNaUXDKdd6se+1ZRXDtPdcKQiF148F9OCoc"
    "YwHOCKl+pOTgQMmJPPGmJkSBRpob9wxEBHLh5EWRlF0TViPFNxEYRUmUcYXUFmo1MUb57Vaj3djC7uOU8zpvd/YhT1B+"
    "09ve8dajTp5SRRuv26uuXV1xXtftlTWHRL2x5TeabW9qJmpZR5v6vF2rrbrVtZrzQv83/z84xkImHD+jfvz0fhbJSuDc"
    "iDnNNMoS2QmU0iUFF5vNMadzHJIJnJsxZ9fMBOOb2VxWRqfTSr90l54kcG7HnPhtpaGeUTUBdStGRU8zjTSK38FV4nvR"
    "4jk5Cdg7MTZ+5vpeCvkvr4qBMA=="
)


def real_expected() -> dict[str, np.ndarray]:
    """The values the TensorFlow script assigned (keys as tf.train.Checkpoint names them)."""
    v = {
        "b": np.array([True, False, True]),
        "bf16": np.array([1.0, -0.5, 3.140625, 65280.0], dtype=ml_dtypes.bfloat16),
        "c64": np.array([1 + 2j, -3j], dtype=np.complex64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "f16": np.array([[0.5, 1e-3], [-2.0, 65504.0]], dtype=np.float16),
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "f64": np.array([1.5, -2.25, np.pi]),
        "i16": np.array([-300, 300], dtype=np.int16),
        "i32": np.array([[1, -2], [3, 2**31 - 1]], dtype=np.int32),
        "i64": np.array([2**40, -5], dtype=np.int64),
        "i8": np.array([-128, 127], dtype=np.int8),
        "nested/w": np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5),
        "scalar": np.array(42.0, dtype=np.float32),
        "u8": np.array([0, 255, 7], dtype=np.uint8),
    }
    return {f"model/{k}/.ATTRIBUTES/VARIABLE_VALUE": a for k, a in v.items()}


def assert_bitwise_equal(got: dict, want: dict) -> None:
    assert list(got) == sorted(want)
    for k, a in want.items():
        b = got[k]
        assert b.dtype == a.dtype, k
        assert b.shape == a.shape, k
        assert b.tobytes() == a.tobytes(), k


@pytest.fixture
def real_ckpt(tmp_path) -> str:
    prefix = str(tmp_path / "real")
    with open(prefix + ".index", "wb") as f:
        f.write(zlib.decompress(base64.b64decode("".join(REAL_INDEX))))
    with open(prefix + ".data-00000-of-00001", "wb") as f:
        f.write(zlib.decompress(base64.b64decode("".join(REAL_DATA))))
    return prefix


# --- an independent TensorBundle writer, from the documented formats -------------------------
def ref_crc32c(data: bytes) -> int:
    """Bitwise CRC-32C: deliberately not the table-driven code under test."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def ref_mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 values are 10-byte two's-complement varints
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pb_varint(field: int, n: int) -> bytes:
    return varint(field << 3) + varint(n)


def pb_bytes(field: int, data: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(data)) + data


def pb_fixed32(field: int, n: int) -> bytes:
    return varint(field << 3 | 5) + n.to_bytes(4, "little")


TF_DTYPE = {
    "float32": 1,
    "float64": 2,
    "int32": 3,
    "uint8": 4,
    "int16": 5,
    "int8": 6,
    "string": 7,
    "int64": 9,
    "bool": 10,
    "bfloat16": 14,
    "float16": 19,
    "resource": 20,
}


def entry_proto(dtype: int, shape, shard: int, offset: int, size: int, crc: int) -> bytes:
    dims = b"".join(pb_bytes(2, pb_varint(1, d)) for d in shape)
    msg = pb_varint(1, dtype) + pb_bytes(2, dims)
    msg += pb_varint(3, shard) if shard else b""
    msg += pb_varint(4, offset) if offset else b""
    msg += pb_varint(5, size) if size else b""
    return msg + pb_fixed32(6, ref_mask(crc))


def table_block(items: list[tuple[bytes, bytes]], restart_interval: int = 2) -> bytes:
    out, restarts, prev = bytearray(), [], b""
    for i, (k, v) in enumerate(items):
        shared = 0
        if i % restart_interval:
            while shared < min(len(k), len(prev)) and k[shared] == prev[shared]:
                shared += 1
        else:
            restarts.append(len(out))
        out += varint(shared) + varint(len(k) - shared) + varint(len(v)) + k[shared:] + v
        prev = k
    restarts = restarts or [0]
    for r in restarts:
        out += r.to_bytes(4, "little")
    return bytes(out + len(restarts).to_bytes(4, "little"))


def build_table(items: list[tuple[bytes, bytes]], block_bytes: int = 96) -> bytes:
    """LevelDB table: data blocks of about ``block_bytes``, an empty metaindex, an index."""
    out = bytearray()

    def put(block: bytes) -> bytes:
        handle = varint(len(out)) + varint(len(block))
        out.extend(block + b"\0" + ref_mask(ref_crc32c(block + b"\0")).to_bytes(4, "little"))
        return handle

    index, group, size = [], [], 0
    for k, v in items:
        group.append((k, v))
        size += len(k) + len(v)
        if size >= block_bytes:
            index.append((group[-1][0], put(table_block(group))))
            group, size = [], 0
    if group:
        index.append((group[-1][0], put(table_block(group))))
    meta = put(table_block([]))
    idx = put(table_block(index, restart_interval=1))
    footer = (meta + idx).ljust(40, b"\0") + TABLE_MAGIC.to_bytes(8, "little")
    return bytes(out + footer)


def build_bundle(prefix: str, tensors: dict, *, shards: int = 2, tamper=None) -> None:
    """Write ``tensors`` (key -> array, or ``("string", bytes)`` / ``("resource", bytes)``) as a
    TensorBundle with ``shards`` data files; ``tamper(key, fields)`` may edit an entry's fields."""
    data = [bytearray() for _ in range(shards)]
    entries = []
    for i, (key, value) in enumerate(sorted(tensors.items())):
        shard = i % shards
        if isinstance(value, tuple):
            dtype, raw, shape = TF_DTYPE[value[0]], value[1], ()
        else:
            dtype, raw, shape = TF_DTYPE[value.dtype.name], value.tobytes(), value.shape
        fields = {"dtype": dtype, "shape": shape, "shard": shard, "offset": len(data[shard])}
        # Table-driven crc for the tensor bytes (the bitwise one is too slow for them);
        # test_crc32c_and_masking_match_the_reference ties it to the independent version.
        fields.update(size=len(raw), crc=crc32c(raw))
        data[shard] += raw
        if tamper:
            tamper(key, fields)
        entries.append((key.encode(), entry_proto(**fields)))
    header = pb_varint(1, shards) + pb_bytes(3, pb_varint(1, 1))  # num_shards, version{producer}
    with open(prefix + ".index", "wb") as f:
        f.write(build_table([(b"", header)] + entries))
    for s in range(shards):
        with open(f"{prefix}.data-{s:05d}-of-{shards:05d}", "wb") as f:
            f.write(data[s])


def sample_tensors() -> dict:
    rng = np.random.default_rng(7)
    v = {
        "net/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal((40, 30)).astype(
            np.float32
        ),
        "net/dense/bias/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal(30),
        "net/emb/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal((20_000,)).astype(np.float32),
        "net/bf/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal(33).astype(ml_dtypes.bfloat16),
        "net/half/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal((2, 3)).astype(np.float16),
        "net/mask/.ATTRIBUTES/VARIABLE_VALUE": rng.standard_normal(17) > 0,
        "net/ids/.ATTRIBUTES/VARIABLE_VALUE": rng.integers(-(2**31), 2**31, (5, 2), dtype=np.int32),
        "net/big/.ATTRIBUTES/VARIABLE_VALUE": rng.integers(-(2**62), 2**62, 9, dtype=np.int64),
        "net/u/.ATTRIBUTES/VARIABLE_VALUE": np.arange(5, dtype=np.uint8),
        "net/empty/.ATTRIBUTES/VARIABLE_VALUE": np.zeros((3, 0), dtype=np.float32),
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE": np.array(3, dtype=np.int64),
    }
    return v


def with_strings(v: dict) -> dict:
    out = dict(v)
    out["_CHECKPOINTABLE_OBJECT_GRAPH"] = ("string", b"\x0a\x05graph-proto-bytes")
    out["net/handle/.ATTRIBUTES/VARIABLE_VALUE"] = ("resource", b"\x01\x02")
    return out


# --- tests -----------------------------------------------------------------------------------
def test_crc32c_and_masking_match_the_reference():
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    for data in (b"", b"a", bytes(range(256)) * 3):
        assert crc32c(data) == ref_crc32c(data)
        assert unmask_crc(mask_crc(crc32c(data))) == crc32c(data)
        assert mask_crc(crc32c(data)) == ref_mask(ref_crc32c(data))


def test_real_tensorflow_checkpoint_converts_bitwise(real_ckpt, tmp_path):
    assert detect_format(real_ckpt) == ("tensorflow", real_ckpt)
    res = convert(real_ckpt, str(tmp_path / "sp"))
    assert res.src_format == "tensorflow" and res.entries == 14
    assert any("_CHECKPOINTABLE_OBJECT_GRAPH" in n for n in res.notes)
    assert_bitwise_equal(sp.load_file(str(tmp_path / "sp")), real_expected())


def test_real_checkpoint_reader_checks_every_tensor_crc(real_ckpt):
    with TensorBundleReader(real_ckpt) as r:
        assert r.num_shards == 1
        for key, want in real_expected().items():
            got = r.read(key, verify=True)
            assert got.tobytes() == want.tobytes() and got.shape == want.shape


def test_built_bundle_two_shards_many_blocks(tmp_path):
    prefix = str(tmp_path / "tf")
    values = sample_tensors()
    build_bundle(prefix, with_strings(values), shards=2)
    with TensorBundleReader(prefix) as r:
        assert r.num_shards == 2 and list(r.entries) == sorted(values)
        assert any("string tensor" in n for n in r.notes)
        assert any("DT_RESOURCE" in n for n in r.notes)
    for compression in ("zstd", "none"):
        dst = str(tmp_path / f"sp-{compression}")
        res = convert(prefix, dst, compression=compression)
        assert res.entries == len(values) and len(res.notes) == 2
        assert_bitwise_equal(sp.load_file(dst), values)
        sp.open(dst).verify()


def test_corrupt_tensor_bytes_are_caught_and_nothing_is_left(tmp_path):
    prefix = str(tmp_path / "tf")
    build_bundle(prefix, sample_tensors(), shards=1)
    with TensorBundleReader(prefix) as r:
        e = r.entries["net/dense/bias/.ATTRIBUTES/VARIABLE_VALUE"]
    shard = prefix + ".data-00000-of-00001"
    with open(shard, "r+b") as f:
        f.seek(e.offset + 5)
        b = f.read(1)
        f.seek(e.offset + 5)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(sp.ChecksumMismatchError) as info:
        convert(prefix, str(tmp_path / "out"))
    msg = str(info.value)
    assert shard in msg and f"offset {e.offset}" in msg and "net/dense/bias" in msg
    assert not sp.exists(str(tmp_path / "out"))
    with TensorBundleReader(prefix) as r, pytest.raises(sp.ChecksumMismatchError):
        r.read("net/dense/bias/.ATTRIBUTES/VARIABLE_VALUE", verify=True)


def test_corrupt_index_block_is_caught(tmp_path):
    prefix = str(tmp_path / "tf")
    build_bundle(prefix, sample_tensors())
    raw = bytearray(open(prefix + ".index", "rb").read())
    raw[20] ^= 0x01
    open(prefix + ".index", "wb").write(bytes(raw))
    with pytest.raises(
        sp.ChecksumMismatchError, match=r"tf\.index: checksum mismatch in table block"
    ):
        TensorBundleReader(prefix)


@pytest.mark.parametrize("cut", [1, 10, 47, 48, 200])
def test_truncated_index_is_corrupt_not_a_crash(tmp_path, cut):
    prefix = str(tmp_path / "tf")
    build_bundle(prefix, sample_tensors())
    raw = open(prefix + ".index", "rb").read()
    open(prefix + ".index", "wb").write(raw[: len(raw) - cut])
    with pytest.raises(sp.CorruptCheckpointError):
        TensorBundleReader(prefix)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("size", 7, "does not match shape"),
        ("shard", 5, "shard_id 5 out of range"),
        ("offset", 1 << 40, "run past the end"),
        ("shape", (2**62, 2**62), "cannot be represented"),
        ("shape", (0, 2**62, 2), "cannot be represented"),
        ("offset", -1, "negative"),
    ],
)
def test_inconsistent_entries_are_refused(tmp_path, field, value, match):
    prefix = str(tmp_path / "tf")
    key = "net/u/.ATTRIBUTES/VARIABLE_VALUE"

    def tamper(k, fields):
        if k == key:
            fields[field] = value

    build_bundle(prefix, sample_tensors(), tamper=tamper, shards=1)
    with pytest.raises(sp.CorruptCheckpointError, match=match):
        with TensorBundleReader(prefix) as r:
            r.read(key)


def test_missing_data_shard_is_not_found(tmp_path):
    prefix = str(tmp_path / "tf")
    build_bundle(prefix, sample_tensors(), shards=2)
    os.remove(prefix + ".data-00001-of-00002")
    with pytest.raises(sp.NotFoundError, match=r"data-00001-of-00002"):
        convert(prefix, str(tmp_path / "out"))
    assert not sp.exists(str(tmp_path / "out"))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=st.dictionaries(
        st.binary(min_size=1, max_size=12), st.binary(max_size=40), min_size=1, max_size=12
    ),
    header=st.binary(max_size=16),
)
def test_hostile_entries_with_valid_block_crcs_raise_clean_errors(tmp_path, items, header):
    """Garbage protobufs inside a well-formed table: only CheckpointError, never anything else."""
    path = str(tmp_path / "fuzz")
    table = build_table([(b"", header)] + sorted(items.items()), block_bytes=32)
    with open(path + ".index", "wb") as f:
        f.write(table)
    try:
        with TensorBundleReader(path) as r:
            for key in r.entries:
                r.read(key)
    except sp.CheckpointError:
        pass


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_byte_damage_to_a_real_index_raises_clean_errors(real_ckpt, data):
    raw = bytearray(zlib.decompress(base64.b64decode("".join(REAL_INDEX))))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with open(real_ckpt + ".index", "wb") as f:
        f.write(raw)
    try:
        with TensorBundleReader(real_ckpt) as r:
            for key in r.entries:
                r.read(key)
    except sp.CheckpointError:
        pass


_CUT = r"""
import os, sys, numpy as np, shardpoint as sp
from shardpoint.convert.tensorbundle import TensorBundleReader
prefix = sys.argv[1]
with TensorBundleReader(prefix) as r:
    keys = sorted(r.entries)
    r.read(keys[0])  # its shard is open now
    shard = prefix + ".data-00000-of-00001"
    os.truncate(shard, os.path.getsize(shard) // 2)
    for k in keys:
        try:
            print(k, float(r.read(k).sum()))
        except sp.CorruptCheckpointError as e:
            print("refused:", e)
            break
"""


def test_a_shard_cut_while_read_is_refused_not_a_sigbus(tmp_path) -> None:
    """A data shard cut by another program after it was opened: the reader handed out views of
    its mapping, and touching one past the new end killed the process with SIGBUS; values are
    now read with ``pread`` into fresh arrays, and the short read names the shard and key. In
    a fresh process, so that a SIGBUS fails the test instead of killing pytest."""
    import subprocess
    import sys

    prefix = str(tmp_path / "ckpt")
    build_bundle(prefix, {f"v{i}": np.full(1 << 18, i, np.float32) for i in range(4)}, shards=1)
    got = subprocess.run(
        [sys.executable, "-c", _CUT, prefix], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    lines = got.stdout.splitlines()
    assert lines[:2] == ["v0 0.0", f"v1 {float(1 << 18)}"], lines  # in the half that is left
    shard = prefix + ".data-00000-of-00001"
    assert lines[2].startswith(f"refused: {shard}: key 'v2': file is now {2 << 20} bytes"), lines
    assert "truncated" in lines[2], lines
