"""An independent reference reader of shardpoint format v1, written from docs/FORMAT.md alone.

It imports neither ``shardpoint`` nor its ``_core``: only numpy, ``zstandard`` (zstd frames),
``ml_dtypes`` (bfloat16/float8 element types) and a crc32c written here. It is deliberately
strict: every rule of the spec that a reader can observe is checked (checksums, bounds,
ordering, alignment, zero padding and gaps), so the Rust writer's output is pinned to the page.
Where the spec leaves something to the writer (chunk boundaries of a compressed payload vs. its
end, gaps between index sections), this reader accepts what the page allows.

Public entry points:

- :func:`read_checkpoint` → :class:`Checkpoint` (values, raw bytes, entry records, metadata);
- :func:`read_index` → the entry records of ``P.index`` alone;
- :func:`load` → ``(dict[str, value], user metadata)``;
- :func:`crc32c`.

Errors are :class:`FormatError` (or :class:`ChecksumError`) naming the file and the offset.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard

__all__ = [
    "FormatError",
    "ChecksumError",
    "crc32c",
    "Checkpoint",
    "EntryRecord",
    "ShardRecord",
    "read_checkpoint",
    "read_index",
    "load",
    "byte_group",
    "byte_ungroup",
]

# ---- crc32c (Castagnoli, reflected polynomial 0x82F63B78) -------------------------------------

_POLY = 0x82F63B78


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()
_NP_TABLE = np.array(_TABLE, dtype=np.uint32)
_SMALL = 1 << 14


def _update_py(reg: int, data: bytes | memoryview) -> int:
    t = _TABLE
    for b in bytes(data):
        reg = t[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def _apply(cols: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Apply the GF(2)-linear map whose images of the 32 unit vectors are ``cols`` to ``x``."""
    out = np.zeros_like(x)
    for j in range(32):
        out ^= np.where((x >> np.uint32(j)) & np.uint32(1), cols[j], np.uint32(0))
    return out


def _zeros_op(n: int) -> np.ndarray:
    """The linear map 'feed n zero bytes into the crc register', as 32 column images."""
    unit = np.array([1 << j for j in range(32)], dtype=np.uint32)
    one = unit.copy()  # one zero byte
    one = _NP_TABLE[one & np.uint32(0xFF)] ^ (one >> np.uint32(8))
    result = unit.copy()  # identity
    power = one
    while n:
        if n & 1:
            result = _apply(power, result)
        n >>= 1
        if n:
            power = _apply(power, power)
    return result


def crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """CRC-32C of ``data``: table-driven; large inputs are split into equal lanes processed in
    parallel with numpy and combined with the zero-byte operator (crc linearity)."""
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = buf.size
    if n < _SMALL:
        return _update_py(0xFFFFFFFF, buf.tobytes()) ^ 0xFFFFFFFF
    # Starting from 0xFFFFFFFF equals starting from 0 with the first 4 bytes complemented.
    head = buf[:4] ^ np.uint8(0xFF)
    lanes_n = 1 << max(1, (math.isqrt(n).bit_length() - 1))
    lane_len = n // lanes_n
    body = np.concatenate([head, buf[4 : lanes_n * lane_len]]).reshape(lanes_n, lane_len)
    cols_t = np.ascontiguousarray(body.T)
    reg = np.zeros(lanes_n, dtype=np.uint32)
    for j in range(lane_len):
        reg = _NP_TABLE[(reg ^ cols_t[j]) & np.uint32(0xFF)] ^ (reg >> np.uint32(8))
    op = _zeros_op(lane_len)
    while reg.size > 1:
        reg = _apply(op, reg[0::2]) ^ reg[1::2]
        op = _apply(op, op)
    r = _update_py(int(reg[0]), buf[lanes_n * lane_len :].tobytes())
    return r ^ 0xFFFFFFFF


# ---- constants of the spec -------------------------------------------------------------------

FORMAT_VERSION = 1
SHARD_MAGIC = b"SPSHARD\0"
SHARD_HEADER_LEN = 64
DATA_START = 4096
ALIGN = 64
PAGE_ALIGN_MIN = 65536
PAGE = 4096
INDEX_MAGIC = b"SPINDEX\0"
INDEX_FOOTER_MAGIC = b"SPINDEND"
INDEX_HEADER_LEN = 128
INDEX_FOOTER_LEN = 16
SHARD_REC = 64
SHARD_NAME_FIELD = 40  # §3.1: bytes 24..64 of the record
BLOCK_REC = 24
BLOCK_ENTRIES = 64
ENTRY_REC = 40
CHUNK_REC = 16
MAX_NDIM = 64
U64_MAX = (1 << 64) - 1
JSON_MAX_DEPTH = 128

# tag -> (name, itemsize, numpy dtype name or ml_dtypes name)
DTYPES: dict[int, tuple[str, int]] = {
    1: ("bool", 1),
    2: ("int8", 1),
    3: ("int16", 2),
    4: ("int32", 4),
    5: ("int64", 8),
    6: ("uint8", 1),
    7: ("uint16", 2),
    8: ("uint32", 4),
    9: ("uint64", 8),
    10: ("float16", 2),
    11: ("bfloat16", 2),
    12: ("float32", 4),
    13: ("float64", 8),
    14: ("complex64", 8),
    15: ("complex128", 16),
    16: ("float8_e4m3fn", 1),
    17: ("float8_e5m2", 1),
    18: ("float8_e4m3fnuz", 1),
    19: ("float8_e5m2fnuz", 1),
    20: ("float8_e8m0fnu", 1),
    21: ("float4_e2m1fn_x2", 1),
}
CODECS = {0: "none", 1: "zstd", 2: "zstd-bytegroup", 3: "bytegroup-huffman"}
KINDS = {0: "tensor", 1: "bytes", 2: "str", 3: "int", 4: "float", 5: "json", 6: "object"}
_ROTATED = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
_SHARD_NAME_RE = re.compile(rb"\.data-[0-9]{5}-of-[0-9]{5}(\.[0-9a-f]{16})?")
_INT_RE = re.compile(r"-?([0-9]+|0x[0-9a-f]+)")  # §6: decimal, or 0x + lowercase hex
_FLOAT_RE = re.compile(r"-?(inf|nan|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)")


def numpy_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype of a format dtype name."""
    if name in (
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    ):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    if name == "float4_e2m1fn_x2":  # two packed fp4 values per byte: the byte is the element
        return np.dtype(np.uint8)
    return np.dtype(name).newbyteorder("<")


def group_width(dtype: str) -> int:
    """Width of the unit byte grouping works on: the element, or one complex component."""
    size = {n: s for n, s in DTYPES.values()}[dtype]
    return size // 2 if dtype.startswith("complex") else size


# ---- errors ----------------------------------------------------------------------------------


class FormatError(ValueError):
    """The bytes violate FORMAT.md v1. The message names the file and the offset."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        super().__init__(f"{path}: offset {offset}: {what}")
        self.path, self.offset, self.what = path, offset, what


class ChecksumError(FormatError):
    """A crc32c recorded in the file does not match the bytes."""


def _check_crc(path: str, offset: int, what: str, stored: int, data: Any) -> None:
    actual = crc32c(data)
    if actual != stored:
        raise ChecksumError(
            path, offset, f"{what}: crc32c stored {stored:#010x}, computed {actual:#010x}"
        )


# ---- byte grouping (§5) ----------------------------------------------------------------------


def _rot_dtype(k: int) -> np.dtype:
    return np.dtype({2: "<u2", 4: "<u4", 8: "<u8"}[k])


def byte_group(dtype: str, raw: bytes) -> bytes:
    """Forward filter of §5 (used by tests to pin the plane order)."""
    k = group_width(dtype)
    if k < 2:
        return bytes(raw)
    if len(raw) % k:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {k}-byte units")
    u = np.frombuffer(raw, dtype=_rot_dtype(k))
    if dtype in _ROTATED:
        bits = 8 * k
        u = (u << np.array(1, dtype=u.dtype)) | (u >> np.array(bits - 1, dtype=u.dtype))
    b = u.astype(_rot_dtype(k)).view(np.uint8).reshape(-1, k)
    planes = [b[:, k - 1 - p] for p in range(k)]
    return b"".join(p.tobytes() for p in planes)


def byte_ungroup(dtype: str, grouped: bytes) -> bytes:
    """Inverse filter of §5: planes most significant first, then rotate right by one bit."""
    k = group_width(dtype)
    if k < 2:
        return bytes(grouped)
    if len(grouped) % k:
        raise ValueError(f"{len(grouped)} bytes is not a whole number of {k}-byte units")
    n = len(grouped) // k
    src = np.frombuffer(grouped, dtype=np.uint8)
    b = np.empty((n, k), dtype=np.uint8)
    for p in range(k):
        b[:, k - 1 - p] = src[p * n : (p + 1) * n]
    u = b.reshape(-1).view(_rot_dtype(k))
    if dtype in _ROTATED:
        bits = 8 * k
        u = (u >> np.array(1, dtype=u.dtype)) | (u << np.array(bits - 1, dtype=u.dtype))
    return u.astype(_rot_dtype(k)).tobytes()


# ---- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardRecord:
    file_len: int
    save_token: int
    header_crc: int
    name: str
    path: str


@dataclass
class EntryRecord:
    index: int
    key: str
    dtype: str
    codec: str
    kind: str
    dims: tuple[int, ...]
    shard: int
    crc: int
    aux_rel: int
    offset: int
    stored_len: int
    raw_len: int
    dims_inline: bool
    chunks: list[tuple[int, int, int]] = field(
        default_factory=list
    )  # (rel_offset, stored_len, crc)
    chunks_stored_raw: int = 0
    planes_compressed: int = 0  # zstd-bytegroup plane segments stored as zstd frames
    planes_raw: int = 0  # zstd-bytegroup plane segments stored as the plane itself
    planes_huffman: int = 0  # bytegroup-huffman planes stored Huffman coded
    planes_constant: int = 0  # bytegroup-huffman planes stored as one repeated byte


@dataclass
class Checkpoint:
    prefix: str
    chunk_bytes: int
    shards: list[ShardRecord]
    entries: dict[str, EntryRecord]
    raw: dict[str, bytes]
    values: dict[str, Any]
    metadata: dict[str, Any]

    @property
    def user_metadata(self) -> dict[str, Any]:
        u = self.metadata.get("user", {})
        return u if isinstance(u, dict) else {}


def _u16(b: bytes, at: int) -> int:
    return struct.unpack_from("<H", b, at)[0]


def _u32(b: bytes, at: int) -> int:
    return struct.unpack_from("<I", b, at)[0]


def _u64(b: bytes, at: int) -> int:
    return struct.unpack_from("<Q", b, at)[0]


def _json_depth(v: Any, depth: int = 0) -> int:
    if isinstance(v, dict):
        return max((_json_depth(x, depth + 1) for x in v.values()), default=depth + 1)
    if isinstance(v, list):
        return max((_json_depth(x, depth + 1) for x in v), default=depth + 1)
    return depth


# ---- the shard file (§2) ---------------------------------------------------------------------


def _read_shard(path: str, rec: ShardRecord) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as e:
        raise FormatError(path, 0, "shard file is missing") from e
    if len(data) != rec.file_len:
        raise FormatError(
            path, len(data), f"shard is {len(data)} bytes, index records {rec.file_len}"
        )
    if len(data) < DATA_START:
        raise FormatError(path, 0, f"shard is {len(data)} bytes, shorter than DATA_START")
    if data[0:8] != SHARD_MAGIC:
        raise FormatError(path, 0, "bad shard magic")
    _check_crc(path, 60, "shard header", _u32(data, 60), data[:60])
    if _u32(data, 8) != FORMAT_VERSION:
        raise FormatError(path, 8, f"shard format_version {_u32(data, 8)}")
    if _u32(data, 12) != SHARD_HEADER_LEN:
        raise FormatError(path, 12, f"shard header_len {_u32(data, 12)} != 64")
    if any(data[32:60]):
        raise FormatError(path, 32, "shard header reserved bytes are not zero")
    if _u64(data, 16) != rec.save_token:
        raise FormatError(path, 16, "shard save_token differs from the index's shard record")
    if _u32(data, 60) != rec.header_crc:
        raise FormatError(path, 60, "shard header_crc differs from the index's shard record")
    if any(data[SHARD_HEADER_LEN:DATA_START]):
        raise FormatError(path, SHARD_HEADER_LEN, "shard header padding is not zero")
    return data


# ---- the index file (§3) ---------------------------------------------------------------------


def _parse_index(prefix: str) -> tuple[dict[str, int], list[ShardRecord], list[EntryRecord], bytes]:
    path = prefix + ".index"
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < INDEX_HEADER_LEN + INDEX_FOOTER_LEN:
        raise FormatError(path, 0, f"index is {len(b)} bytes")
    if b[0:8] != INDEX_MAGIC:
        raise FormatError(path, 0, "bad index magic")
    header_crc = _u32(b, 124)
    _check_crc(path, 124, "index header", header_crc, b[:124])
    if _u32(b, 8) != FORMAT_VERSION:
        raise FormatError(path, 8, f"unsupported format_version {_u32(b, 8)}")
    if _u32(b, 12) != INDEX_HEADER_LEN:
        raise FormatError(path, 12, f"index header_len {_u32(b, 12)} != 128")
    h = {
        "file_len": _u64(b, 16),
        "entry_count": _u64(b, 24),
        "shard_count": _u32(b, 32),
        "chunk_bytes": _u32(b, 36),
        "shards_off": _u64(b, 40),
        "blocks_off": _u64(b, 48),
        "entries_off": _u64(b, 56),
        "keys_off": _u64(b, 64),
        "keys_len": _u64(b, 72),
        "aux_off": _u64(b, 80),
        "aux_len": _u64(b, 88),
        "meta_off": _u64(b, 96),
        "meta_len": _u64(b, 104),
        "shards_crc": _u32(b, 112),
        "blocks_crc": _u32(b, 116),
        "meta_crc": _u32(b, 120),
    }
    if h["file_len"] != len(b):
        raise FormatError(path, 16, f"file_len {h['file_len']} but the file has {len(b)} bytes")
    foot = len(b) - INDEX_FOOTER_LEN
    if b[foot : foot + 8] != INDEX_FOOTER_MAGIC:
        raise FormatError(path, foot, "bad footer magic")
    if _u32(b, foot + 8) != header_crc:
        raise FormatError(path, foot + 8, "footer header_crc copy differs from the header")
    if _u32(b, foot + 12) != 0:
        raise FormatError(path, foot + 12, "footer reserved bytes are not zero")
    cb = h["chunk_bytes"]
    if cb % 16 or not 4096 <= cb <= 64 << 20:
        raise FormatError(path, 36, f"chunk_bytes {cb} out of range")
    n = h["entry_count"]
    nblocks = -(-n // BLOCK_ENTRIES)
    sections = [
        ("shards", h["shards_off"], h["shard_count"] * SHARD_REC),
        ("blocks", h["blocks_off"], nblocks * BLOCK_REC),
        ("entries", h["entries_off"], n * ENTRY_REC),
        ("keys", h["keys_off"], h["keys_len"]),
        ("aux", h["aux_off"], h["aux_len"]),
        ("meta", h["meta_off"], h["meta_len"]),
    ]
    pos = INDEX_HEADER_LEN
    for name, off, ln in sections:
        end = off + ln
        if end > U64_MAX or off < pos or end > foot:
            raise FormatError(path, off, f"section {name} [{off}, +{ln}) out of order or bounds")
        if name in ("shards", "blocks", "entries") and off % 8:
            raise FormatError(path, off, f"section {name} is not 8-byte aligned")
        pos = end
    so, bo, eo = h["shards_off"], h["blocks_off"], h["entries_off"]
    ko, ao = h["keys_off"], h["aux_off"]
    _check_crc(path, 112, "shard table", h["shards_crc"], b[so : so + h["shard_count"] * SHARD_REC])
    _check_crc(path, 116, "block table", h["blocks_crc"], b[bo : bo + nblocks * BLOCK_REC])
    meta = b[h["meta_off"] : h["meta_off"] + h["meta_len"]]
    _check_crc(path, 120, "metadata", h["meta_crc"], meta)

    # §3.1 shard records.
    shards = []
    for i in range(h["shard_count"]):
        at = so + i * SHARD_REC
        r = b[at : at + SHARD_REC]
        name_len = _u32(r, 20)
        if not 1 <= name_len <= SHARD_NAME_FIELD:
            raise FormatError(path, at + 20, f"shard record {i}: name_len {name_len}")
        name = r[24 : 24 + name_len]
        if any(r[24 + name_len :]):
            raise FormatError(path, at + 24 + name_len, f"shard record {i}: name not zero padded")
        if not _SHARD_NAME_RE.fullmatch(name):
            raise FormatError(path, at + 24, f"shard record {i}: refused name {name!r}")
        shards.append(
            ShardRecord(_u64(r, 0), _u64(r, 8), _u32(r, 16), name.decode(), prefix + name.decode())
        )

    # §3.2 blocks, §3.3 entries.
    blocks = []
    for k in range(nblocks):
        at = bo + k * BLOCK_REC
        key_lo, aux_lo, bcrc, res = _u64(b, at), _u64(b, at + 8), _u32(b, at + 16), _u32(b, at + 20)
        if res:
            raise FormatError(path, at + 20, f"block {k}: reserved bytes are not zero")
        blocks.append((key_lo, aux_lo, bcrc))
    entries: list[EntryRecord] = []
    prev_key: bytes | None = None
    for k, (key_lo, aux_lo, bcrc) in enumerate(blocks):
        at = bo + k * BLOCK_REC
        key_hi = blocks[k + 1][0] if k + 1 < nblocks else h["keys_len"]
        aux_hi = blocks[k + 1][1] if k + 1 < nblocks else h["aux_len"]
        if k == 0 and (key_lo != 0 or aux_lo != 0):
            raise FormatError(path, at, "block 0 does not start at the start of the blobs")
        if not (key_lo <= key_hi <= h["keys_len"] and aux_lo <= aux_hi <= h["aux_len"]):
            raise FormatError(path, at, f"block {k}: key/aux ranges decrease or leave the blobs")
        lo, hi = k * BLOCK_ENTRIES, min(n, (k + 1) * BLOCK_ENTRIES)
        ents = b[eo + lo * ENTRY_REC : eo + hi * ENTRY_REC]
        keys = b[ko + key_lo : ko + key_hi]
        aux = b[ao + aux_lo : ao + aux_hi]
        _check_crc(path, at + 16, f"block {k}", bcrc, ents + keys + aux)
        for i in range(lo, hi):
            rec_at = eo + i * ENTRY_REC
            e = _parse_entry(path, b, rec_at, i, keys, aux, shards, cb)
            kb = e.key.encode()
            if prev_key is not None and not prev_key < kb:
                raise FormatError(path, rec_at, f"entry {i}: keys not strictly increasing")
            prev_key = kb
            entries.append(e)
    return h, shards, entries, meta


def _parse_entry(
    path: str,
    b: bytes,
    at: int,
    i: int,
    keys: bytes,
    aux: bytes,
    shards: list[ShardRecord],
    cb: int,
) -> EntryRecord:
    r = b[at : at + ENTRY_REC]
    key_rel, key_len = _u32(r, 0), _u16(r, 4)
    dtype_t, codec_t, kind_t, ndim = r[6], r[7], r[8], r[9]
    if key_len == 0 or key_rel + key_len > len(keys):
        raise FormatError(path, at, f"entry {i}: key [{key_rel}, +{key_len}) outside its block")
    kb = keys[key_rel : key_rel + key_len]
    if b"\0" in kb:
        raise FormatError(path, at, f"entry {i}: key contains NUL")
    try:
        key = kb.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(path, at, f"entry {i}: key is not UTF-8") from e
    where = f"entry {i} ({key!r})"
    if dtype_t not in DTYPES or codec_t not in CODECS or kind_t not in KINDS:
        raise FormatError(
            path, at + 6, f"{where}: unknown tag dtype={dtype_t} codec={codec_t} kind={kind_t}"
        )
    if ndim > MAX_NDIM:
        raise FormatError(path, at + 9, f"{where}: ndim {ndim}")
    if r[10] or r[11]:
        raise FormatError(path, at + 10, f"{where}: reserved bytes are not zero")
    dtype, itemsize = DTYPES[dtype_t]
    codec, kind = CODECS[codec_t], KINDS[kind_t]
    shard, ecrc, aux_rel = _u32(r, 12), _u32(r, 16), _u32(r, 20)
    offset, stored_len = _u64(r, 24), _u64(r, 32)
    if shard >= len(shards):
        raise FormatError(path, at + 12, f"{where}: shard {shard} out of range")
    pos = aux_rel
    inline = codec == "none" and ndim == 1
    if inline:
        if stored_len % itemsize:
            raise FormatError(path, at + 32, f"{where}: stored_len not a multiple of itemsize")
        dims: tuple[int, ...] = (stored_len // itemsize,)
    else:
        if pos + 8 * ndim > len(aux):
            raise FormatError(path, at + 20, f"{where}: dims outside the block's aux range")
        dims = struct.unpack_from(f"<{ndim}Q", aux, pos)
        pos += 8 * ndim
    raw_len = itemsize
    for d in dims:
        raw_len *= d
    if raw_len > U64_MAX:
        raise FormatError(path, at, f"{where}: raw length overflows u64")
    if kind != "tensor" and (dtype != "uint8" or ndim != 1):
        raise FormatError(path, at + 6, f"{where}: typed entry is not 1-d uint8")
    chunks: list[tuple[int, int, int]] = []
    if codec == "none":
        if stored_len != raw_len:
            raise FormatError(path, at + 32, f"{where}: stored_len {stored_len} != raw {raw_len}")
    else:
        if stored_len > raw_len:
            raise FormatError(path, at + 32, f"{where}: stored_len > raw_len")
        nch = -(-raw_len // cb)
        if pos + CHUNK_REC * nch > len(aux):
            raise FormatError(path, at + 20, f"{where}: chunk table outside the block's aux range")
        expect = 0
        for c in range(nch):
            rel, sl, cc = struct.unpack_from("<QII", aux, pos + c * CHUNK_REC)
            raw_n = min(cb, raw_len - c * cb)
            if rel != expect or sl > raw_n:
                raise FormatError(path, at, f"{where}: chunk {c} [{rel}, +{sl}) not contiguous")
            expect = rel + sl
            chunks.append((rel, sl, cc))
        if expect != stored_len:
            raise FormatError(path, at, f"{where}: chunks cover {expect} of {stored_len} bytes")
    s = shards[shard]
    if offset < DATA_START or offset % ALIGN or offset + stored_len > s.file_len:
        raise FormatError(path, at + 24, f"{where}: payload [{offset}, +{stored_len}) misplaced")
    if codec == "none" and stored_len >= PAGE_ALIGN_MIN and offset % PAGE:
        raise FormatError(path, at + 24, f"{where}: payload of {stored_len} bytes not page aligned")
    return EntryRecord(
        i,
        key,
        dtype,
        codec,
        kind,
        tuple(dims),
        shard,
        ecrc,
        aux_rel,
        offset,
        stored_len,
        raw_len,
        inline,
        chunks,
    )


# ---- decoding --------------------------------------------------------------------------------


def _zstd_exact(stored: bytes, n: int, path: str, at: int, where: str) -> bytes:
    """One zstd frame that decodes to exactly ``n`` bytes, with nothing after it."""
    d = zstandard.ZstdDecompressor().decompressobj()
    try:
        out = d.decompress(stored)
    except zstandard.ZstdError as err:
        raise FormatError(path, at, f"{where}: zstd: {err}") from err
    if not d.eof or d.unused_data or len(out) != n:
        raise FormatError(
            path,
            at,
            f"{where}: not exactly one zstd frame of {n} bytes "
            f"(got {len(out)}, eof={d.eof}, trailing={len(d.unused_data)})",
        )
    return out


def _decode_bytegroup(
    e: EntryRecord, stored: bytes, raw_n: int, path: str, at: int, where: str
) -> bytes:
    """§5: a compressed zstd-bytegroup chunk is k segments (u32 seg_len ≤ n, then the plane
    itself if seg_len = n, else one zstd frame of exactly n bytes) that exactly fill it."""
    k = group_width(e.dtype)
    if k < 2:
        raise FormatError(path, at, f"{where}: byte grouping is defined for itemsize >= 2 only")
    n = raw_n // k
    planes, pos = [], 0
    for p in range(k):
        if pos + 4 > len(stored):
            raise FormatError(path, at + pos, f"{where}: plane {p}: segment header past the end")
        seg_len = _u32(stored, pos)
        pos += 4
        if seg_len > n or pos + seg_len > len(stored):
            raise FormatError(path, at + pos - 4, f"{where}: plane {p}: segment of {seg_len} bytes")
        seg = stored[pos : pos + seg_len]
        if seg_len == n:
            e.planes_raw += 1
            planes.append(seg)
        else:
            e.planes_compressed += 1
            planes.append(_zstd_exact(seg, n, path, at + pos, f"{where} plane {p}"))
        pos += seg_len
    if pos != len(stored):
        raise FormatError(path, at + pos, f"{where}: {len(stored) - pos} bytes after plane {k - 1}")
    return byte_ungroup(e.dtype, b"".join(planes))


HUFF_MAX_LEN = 11
HUFF_STREAMS = 8


def _huffman_plane(seg: bytes, n: int, path: str, at: int, where: str) -> bytes:
    """§5.1: an order-0 canonical Huffman plane: table (lo, count - 1, 4-bit lengths), the
    sizes of streams 0..6 (u32), then 8 LSB-first bit streams of ceil(n / 8) symbols each (the
    last ones shorter), each ending in its last byte."""
    if len(seg) < 2:
        raise FormatError(path, at, f"{where}: huffman table header past the end")
    lo, count = seg[0], seg[1] + 1
    if lo + count > 256:
        raise FormatError(path, at, f"{where}: huffman table past symbol 255")
    hdr = 2 + (count + 1) // 2
    if len(seg) < hdr + 4 * (HUFF_STREAMS - 1):
        raise FormatError(path, at, f"{where}: huffman header past the end")
    lens = {}
    for i in range(count):
        b = seg[2 + i // 2]
        ln = b & 15 if i % 2 == 0 else b >> 4
        if ln > HUFF_MAX_LEN:
            raise FormatError(path, at, f"{where}: huffman code length {ln}")
        if ln:
            lens[lo + i] = ln
    if sum(1 << (HUFF_MAX_LEN - ln) for ln in lens.values()) != 1 << HUFF_MAX_LEN:
        raise FormatError(path, at, f"{where}: huffman lengths are not a complete prefix code")
    # Canonical codes: by (length, symbol), consecutive values, shifted left at each new length.
    codes: dict[tuple[int, int], int] = {}  # (length, code read MSB first) -> symbol
    code, prev = 0, 0
    for sym, ln in sorted(lens.items(), key=lambda kv: (kv[1], kv[0])):
        code <<= ln - prev
        codes[(ln, code)] = sym
        code, prev = code + 1, ln
    sizes = [_u32(seg, hdr + 4 * i) for i in range(HUFF_STREAMS - 1)]
    pos = hdr + 4 * (HUFF_STREAMS - 1)
    sizes.append(len(seg) - pos - sum(sizes))
    if sizes[-1] < 0:
        raise FormatError(path, at, f"{where}: huffman streams past the segment end")
    q = -(-n // HUFF_STREAMS)
    out = bytearray()
    for s, size in enumerate(sizes):
        stream, pos = seg[pos : pos + size], pos + size
        bits = int.from_bytes(stream, "little")
        nbits, used = 8 * size, 0
        for _ in range(max(0, min(n, (s + 1) * q) - min(n, s * q))):
            code, ln = 0, 0
            while (ln, code) not in codes:
                if ln == HUFF_MAX_LEN or used >= nbits:
                    raise FormatError(path, at, f"{where}: huffman stream {s} ends early")
                code = (code << 1) | ((bits >> used) & 1)  # LSB-first stream, MSB-first code
                used, ln = used + 1, ln + 1
            out.append(codes[(ln, code)])
        if (used + 7) // 8 != size:
            raise FormatError(path, at, f"{where}: huffman stream {s} holds unused bytes")
    return bytes(out)


def _decode_bytegroup_huffman(
    e: EntryRecord, stored: bytes, raw_n: int, path: str, at: int, where: str
) -> bytes:
    """§5.1: k u32 segment lengths, the raw planes (seg_len = n) in plane order, then the
    coded segments in plane order (mode 0: one repeated byte; mode 1: Huffman)."""
    k = group_width(e.dtype)
    if k < 2:
        raise FormatError(path, at, f"{where}: byte grouping is defined for itemsize >= 2 only")
    n = raw_n // k
    if len(stored) < 4 * k:
        raise FormatError(path, at, f"{where}: plane table past the end")
    lens = [_u32(stored, 4 * p) for p in range(k)]
    raw_pos = 4 * k
    coded_pos = raw_pos + n * sum(1 for ln in lens if ln == n)
    total = coded_pos + sum(ln for ln in lens if ln != n)
    if any(ln == 0 or ln > n for ln in lens) or total != len(stored):
        raise FormatError(path, at, f"{where}: plane lengths {lens} do not fill {len(stored)}")
    planes = []
    for p, ln in enumerate(lens):
        if ln == n:
            e.planes_raw += 1
            planes.append(stored[raw_pos : raw_pos + n])
            raw_pos += n
            continue
        seg = stored[coded_pos : coded_pos + ln]
        if seg[0] == 0 and ln == 2:
            e.planes_constant += 1
            planes.append(bytes([seg[1]]) * n)
        elif seg[0] == 1:
            e.planes_huffman += 1
            planes.append(
                _huffman_plane(seg[1:], n, path, at + coded_pos + 1, f"{where} plane {p}")
            )
        else:
            raise FormatError(path, at + coded_pos, f"{where}: plane {p}: mode {seg[0]}")
        coded_pos += ln
    return byte_ungroup(e.dtype, b"".join(planes))


def _decode_payload(e: EntryRecord, shard_path: str, data: bytes, cb: int) -> bytes:
    payload = data[e.offset : e.offset + e.stored_len]
    if e.codec == "none":
        raw = payload
    else:
        parts = []
        for c, (rel, sl, ccrc) in enumerate(e.chunks):
            raw_n = min(cb, e.raw_len - c * cb)
            stored = payload[rel : rel + sl]
            where = f"key {e.key!r} chunk {c}"
            at = e.offset + rel
            _check_crc(shard_path, at, where, ccrc, stored)
            if sl == raw_n:
                e.chunks_stored_raw += 1
                parts.append(stored)  # stored raw (whole, never filtered)
            elif e.codec == "zstd":
                parts.append(_zstd_exact(stored, raw_n, shard_path, at, where))
            elif e.codec == "bytegroup-huffman":
                parts.append(_decode_bytegroup_huffman(e, stored, raw_n, shard_path, at, where))
            else:
                parts.append(_decode_bytegroup(e, stored, raw_n, shard_path, at, where))
        raw = b"".join(parts)
    _check_crc(shard_path, e.offset, f"key {e.key!r} raw bytes", e.crc, raw)
    return raw


def _value(e: EntryRecord, raw: bytes, path: str) -> Any:
    def bad(what: str) -> FormatError:
        return FormatError(path, e.offset, f"key {e.key!r}: {what}")

    if e.kind == "tensor":
        if e.dtype == "bool" and any(x > 1 for x in raw):
            raise bad("bool element is neither 0 nor 1")
        return np.frombuffer(raw, dtype=numpy_dtype(e.dtype)).reshape(e.dims)
    if e.kind == "bytes":
        return bytes(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad(f"{e.kind} value is not UTF-8: {err}") from err
    if e.kind == "str":
        return text
    if e.kind == "int":
        if not _INT_RE.fullmatch(text):
            raise bad(f"int value {text[:40]!r}")
        neg, body = text.startswith("-"), text.lstrip("-")
        if body.startswith("0x"):
            v = int(body[2:], 16)
        else:
            old = sys.get_int_max_str_digits()
            sys.set_int_max_str_digits(0)
            try:
                v = int(body)
            finally:
                sys.set_int_max_str_digits(old)
        return -v if neg else v
    if e.kind == "float":
        if not _FLOAT_RE.fullmatch(text):
            raise bad(f"float value {text[:40]!r}")
        return float(text)
    v = json.loads(text)
    if _json_depth(v) > JSON_MAX_DEPTH:
        raise bad("JSON nested too deep")
    return v


def read_checkpoint(prefix: str | os.PathLike[str]) -> Checkpoint:
    """Parse and fully verify checkpoint ``prefix`` and decode every entry."""
    prefix = os.fspath(prefix)
    h, shards, entries, meta = _parse_index(prefix)
    ipath = prefix + ".index"
    try:
        metadata = json.loads(meta.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise FormatError(ipath, h["meta_off"], f"metadata is not UTF-8 JSON: {err}") from err
    if not isinstance(metadata, dict):
        raise FormatError(ipath, h["meta_off"], "metadata is not a JSON object")
    if _json_depth(metadata) > JSON_MAX_DEPTH:
        raise FormatError(ipath, h["meta_off"], "metadata nested too deep")
    if metadata.get("format") != FORMAT_VERSION:
        raise FormatError(ipath, h["meta_off"], f"metadata format {metadata.get('format')!r}")
    datas = [_read_shard(s.path, s) for s in shards]
    # Payloads of one shard do not overlap, and every byte between them is zero (§2).
    for si, data in enumerate(datas):
        spans = sorted((e.offset, e.offset + e.stored_len, e.key) for e in entries if e.shard == si)
        pos = DATA_START
        for lo, hi, key in spans:
            if lo < pos:
                raise FormatError(shards[si].path, lo, f"payload of {key!r} overlaps another")
            if any(data[pos:lo]):
                raise FormatError(
                    shards[si].path, pos, f"gap before the payload of {key!r} is not zero"
                )
            pos = hi
        if any(data[pos:]):
            raise FormatError(shards[si].path, pos, "bytes after the last payload are not zero")
    raw: dict[str, bytes] = {}
    values: dict[str, Any] = {}
    by_key: dict[str, EntryRecord] = {}
    for e in entries:
        spath = shards[e.shard].path
        r = _decode_payload(e, spath, datas[e.shard], h["chunk_bytes"])
        raw[e.key] = r
        values[e.key] = _value(e, r, spath)
        by_key[e.key] = e
    return Checkpoint(prefix, h["chunk_bytes"], shards, by_key, raw, values, metadata)


def read_index(prefix: str | os.PathLike[str]) -> dict[str, EntryRecord]:
    """Parse and check ``P.index`` only (no shard is opened): the entry records by key."""
    _, _, entries, _ = _parse_index(os.fspath(prefix))
    return {e.key: e for e in entries}


def load(prefix: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(values, user metadata)`` of checkpoint ``prefix``, fully verified."""
    ck = read_checkpoint(prefix)
    return ck.values, ck.user_metadata
