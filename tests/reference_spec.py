"""Constants, dtypes, errors and byte grouping of format v1 (docs/FORMAT.md), for the reference
reader (:mod:`reference_reader`): written from the page alone, no ``shardpoint`` import."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np

from reference_crc import crc32c

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
# §3.1.1 (index format_version 2 only): "/" HH "/data-SSSSS-of-NNNNN" [. token], HH checked
# against the hash of the plain name by the reader
_HASHED_NAME_RE = re.compile(rb"/([0-9a-f]{2})/data-([0-9]{5}-of-[0-9]{5})(\.[0-9a-f]{16})?")
INDEX_VERSION_HASHED = 2
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


# ---- little-endian integers ------------------------------------------------------------------


def _u16(b: bytes, at: int) -> int:
    return struct.unpack_from("<H", b, at)[0]


def _u32(b: bytes, at: int) -> int:
    return struct.unpack_from("<I", b, at)[0]


def _u64(b: bytes, at: int) -> int:
    return struct.unpack_from("<Q", b, at)[0]
