"""The TensorBundle V2 format, parsed without TensorFlow: the index table and its entries.

A TensorBundle with prefix ``P`` is ``P.index`` plus ``P.data-SSSSS-of-NNNNN`` shard files.

``P.index`` is an immutable sorted string table in LevelDB's table format (TensorFlow's copy in
``tensorflow/core/lib/io/table*``):

- a 48-byte footer at the end: two BlockHandles (metaindex, index; each a varint64 offset and a
  varint64 size), zero padding to 40 bytes, then the magic ``0xdb4775248b80fb57`` (fixed64 LE);
- every block is followed by a 5-byte trailer: one compression-type byte (TensorFlow writes the
  bundle index uncompressed, 0) and the *masked* crc32c of the block bytes plus that type byte;
- a block is a run of entries ``varint32 shared, varint32 non_shared, varint32 value_len,
  key[shared:] bytes, value bytes`` (keys are prefix-compressed against the previous key),
  then ``restarts`` × fixed32 restart offsets and a fixed32 ``restarts``;
- the index block maps separator keys to BlockHandles of the data blocks, in key order.

Table values are protobuf messages (``tensorflow/core/protobuf/tensor_bundle.proto``): under key
``""`` a ``BundleHeaderProto {1: num_shards int32, 2: endianness enum (0 LITTLE, 1 BIG),
3: version VersionDef}``, under every other key a ``BundleEntryProto {1: dtype enum DataType,
2: shape TensorShapeProto {2: repeated Dim {1: size int64, 2: name}, 3: unknown_rank bool},
3: shard_id int32, 4: offset int64, 5: size int64, 6: crc32c fixed32 (masked), 7: slices}``.
Tensor bytes are stored raw and densely packed; the crc32c covers exactly those bytes.

Everything read from disk is treated as hostile: each varint, length and offset is bounds
checked before use and every failure is a :class:`CorruptCheckpointError` naming the file and
offset. The block checksums are verified here (:class:`_Table`); the reader of the tensors is
:mod:`shardpoint.convert.tensorbundle`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from .. import _core
from ..errors import (
    ChecksumMismatchError,
    UnsupportedFormatError,
)

__all__ = [
    "TABLE_MAGIC",
    "BundleEntry",
    "crc32c",
    "mask_crc",
    "unmask_crc",
    "is_tensorbundle_index",
    "TF_DTYPES",
]

TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48
_TRAILER_LEN = 5
_MASK_DELTA = 0xA282EAD8
#: An index larger than this is not a TensorBundle index we are willing to read into memory.
_MAX_INDEX_BYTES = 1 << 30
_MAX_NDIM = 64
_MAX_SHARDS = 1 << 20
#: Longest key accepted (a shardpoint key holds at most 65535 bytes; TensorFlow's are short).
_MAX_KEY_BYTES = 65535
#: Keys are prefix-compressed, so a small hostile index can describe huge keys ("share all of
#: the previous key, add one byte" over and over). The bytes of all keys built while parsing
#: (each key as it is expanded, and again the in-memory size of each key kept as a ``str``)
#: are bounded by this plus a multiple of the index size (real checkpoints stay far below:
#: even 100k keys sharing long scopes expand by well under 10x). Keys are streamed: only the
#: keys of convertible entries stay in memory.
_KEY_BYTES_BASE = 64 << 20
_KEY_BYTES_PER_INDEX_BYTE = 32
#: Skipped entries listed one by one in ``notes`` (the rest are counted in one last note), and
#: characters of a key shown in a note or error (a hostile key may be 64 KiB long).
_MAX_NOTES = 64
_SHOWN_KEY_CHARS = 100

#: TensorFlow DataType enum value -> shardpoint format dtype name (types.proto).
TF_DTYPES: dict[int, str] = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    22: "uint32",
    23: "uint64",
    24: "float8_e5m2",
    25: "float8_e4m3fn",
}
#: Names of the DataType values that are recognised but not converted (for notes).
TF_OTHER_DTYPES: dict[int, str] = {
    7: "DT_STRING",
    11: "DT_QINT8",
    12: "DT_QUINT8",
    13: "DT_QINT32",
    15: "DT_QINT16",
    16: "DT_QUINT16",
    20: "DT_RESOURCE",
    21: "DT_VARIANT",
    29: "DT_INT4",
    30: "DT_UINT4",
}
DT_STRING = 7


# --- crc32c (Castagnoli): the core's hardware-accelerated implementation ------------------------
def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data`` (continuing ``crc``), computed by the Rust core at native speed."""
    return _core.crc32c(data, crc)


def mask_crc(crc: int) -> int:
    """LevelDB/TensorFlow's crc masking (so a crc of data containing crcs stays well mixed)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    """Inverse of :func:`mask_crc`."""
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _shown(key: str | bytes) -> str:
    """``repr`` of a key for notes and errors, cut after :data:`_SHOWN_KEY_CHARS` characters."""
    if len(key) <= _SHOWN_KEY_CHARS:
        return repr(key)
    unit = "characters" if isinstance(key, str) else "bytes"
    return f"{key[:_SHOWN_KEY_CHARS]!r}... ({len(key)} {unit})"


# --- bounds-checked primitive decoding ---------------------------------------------------------
class _Corrupt(Exception):
    """Internal: a decoding failure at a position; turned into CorruptCheckpointError at the edge."""

    def __init__(self, msg: str, pos: int) -> None:
        super().__init__(msg)
        self.pos = pos


def _varint(buf: bytes, pos: int, end: int, bits: int = 64) -> tuple[int, int]:
    """Decode an unsigned varint of at most ``bits`` bits from ``buf[pos:end]``."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Corrupt("truncated varint", start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift >= 70:  # a 64-bit varint has at most 10 bytes
            raise _Corrupt("varint too long", start)
    if result >> bits:
        raise _Corrupt(f"varint does not fit in {bits} bits", start)
    return result, pos


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, int | bytes, int]]:
    """All (field number, wire type, value, position) of one protobuf message."""
    out: list[tuple[int, int, int | bytes, int]] = []
    while pos < end:
        at = pos
        tag, pos = _varint(buf, pos, end)
        num, wire = tag >> 3, tag & 7
        if num == 0:
            raise _Corrupt("protobuf field number 0", at)
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 1:
            if pos + 8 > end:
                raise _Corrupt("truncated fixed64", at)
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if n > end - pos:
                raise _Corrupt("length-delimited field runs past its message", at)
            value = bytes(buf[pos : pos + n])
            pos += n
        elif wire == 5:
            if pos + 4 > end:
                raise _Corrupt("truncated fixed32", at)
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:  # groups (3, 4) and reserved wire types never appear in these messages
            raise _Corrupt(f"unsupported protobuf wire type {wire}", at)
        out.append((num, wire, value, at))
    return out


# --- the bundle's messages ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BundleEntry:
    """One BundleEntryProto: where a tensor's bytes are and what they are."""

    key: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c_masked: int
    has_slices: bool = False
    #: set when the shape is unknown (unknown_rank) — such an entry cannot be converted
    unknown_rank: bool = False

    @property
    def dtype_name(self) -> str | None:
        """shardpoint dtype name, or None when the dtype is not a plain numeric one."""
        return TF_DTYPES.get(self.dtype)


def _parse_shape(raw: bytes) -> tuple[tuple[int, ...], bool]:
    dims: list[int] = []
    unknown = False
    for num, wire, value, at in _fields(raw, 0, len(raw)):
        if num == 2 and wire == 2:
            assert isinstance(value, bytes)
            size = 0
            for dnum, dwire, dval, _ in _fields(value, 0, len(value)):
                if dnum == 1 and dwire == 0:
                    assert isinstance(dval, int)
                    size = _signed64(dval)
            if size < 0:
                raise _Corrupt(f"negative dimension {size}", at)
            dims.append(size)
            if len(dims) > _MAX_NDIM:
                raise _Corrupt(f"more than {_MAX_NDIM} dimensions", at)
        elif num == 3 and wire == 0:
            unknown = bool(value)
    return tuple(dims), unknown


def _parse_entry(key: str, raw: bytes) -> BundleEntry:
    dtype = shard_id = offset = size = crc = 0
    shape: tuple[int, ...] = ()
    unknown = slices = False
    for num, wire, value, _ in _fields(raw, 0, len(raw)):
        if wire == 0 and isinstance(value, int):
            if num == 1:
                dtype = value
            elif num == 3:
                shard_id = _signed64(value)
            elif num == 4:
                offset = _signed64(value)
            elif num == 5:
                size = _signed64(value)
        elif wire == 2 and isinstance(value, bytes):
            if num == 2:
                shape, unknown = _parse_shape(value)
            elif num == 7:
                slices = True
        elif wire == 5 and num == 6 and isinstance(value, int):
            crc = value
    if shard_id < 0 or offset < 0 or size < 0:
        raise _Corrupt(f"negative shard_id/offset/size ({shard_id}/{offset}/{size})", 0)
    return BundleEntry(key, dtype, shape, shard_id, offset, size, crc, slices, unknown)


def is_tensorbundle_index(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` ends with the table magic (a TensorBundle index, not a shardpoint one)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < _FOOTER_LEN:
                return False
            f.seek(-8, os.SEEK_END)
            return int.from_bytes(f.read(8), "little") == TABLE_MAGIC
    except OSError:
        return False


@dataclass
class _Table:
    """An SSTable being parsed: :meth:`items` yields every (key, value) pair in order, checked
    as it goes, so that nothing but the current and previous key is held while parsing."""

    path: str
    buf: bytes
    #: key bytes that may still be materialised (see _KEY_BYTES_BASE)
    key_budget: int = 0

    def charge(self, nbytes: int, pos: int) -> None:
        """Spend ``nbytes`` of the key budget (refusing the index when it runs out)."""
        self.key_budget -= nbytes
        if self.key_budget < 0:
            raise _Corrupt(
                "keys expand to more than "
                f"{_KEY_BYTES_BASE + _KEY_BYTES_PER_INDEX_BYTE * len(self.buf)} bytes "
                "(prefix compression abused: a hostile or corrupt index)",
                pos,
            )

    def items(self) -> Iterator[tuple[bytes, bytes, int]]:
        """(key, value, offset of its block) of every entry of the data blocks, in order."""
        n = len(self.buf)
        self.key_budget = _KEY_BYTES_BASE + _KEY_BYTES_PER_INDEX_BYTE * n
        if n < _FOOTER_LEN:
            raise _Corrupt(f"file is {n} bytes, shorter than the {_FOOTER_LEN}-byte footer", 0)
        foot = n - _FOOTER_LEN
        if int.from_bytes(self.buf[n - 8 :], "little") != TABLE_MAGIC:
            raise _Corrupt("bad table magic (not a TensorFlow checkpoint index)", n - 8)
        pos = foot
        _meta_off, pos = _varint(self.buf, pos, n - 8)
        _meta_size, pos = _varint(self.buf, pos, n - 8)
        idx_off, pos = _varint(self.buf, pos, n - 8)
        idx_size, pos = _varint(self.buf, pos, n - 8)
        index = self._block(idx_off, idx_size, foot)
        handles = [handle for _sep, handle in self._block_entries(index, idx_off)]
        del index
        prev_end = 0
        prev: bytes | None = None
        for handle in handles:
            off, hp = _varint(handle, 0, len(handle))
            size, hp = _varint(handle, hp, len(handle))
            if off < prev_end:
                raise _Corrupt("data blocks overlap or are out of order", idx_off)
            prev_end = off + size + _TRAILER_LEN
            block = self._block(off, size, idx_off)
            for k, v in self._block_entries(block, off):
                # checked entry by entry, so a bad table stops before it grows
                if prev is not None and not prev < k:
                    raise _Corrupt(f"keys out of order: {_shown(k)} after {_shown(prev)}", off)
                yield k, v, off
                prev = k

    def _block(self, off: int, size: int, limit: int) -> bytes:
        """Block bytes at ``off`` after checking bounds, trailer type and masked crc."""
        if off + size + _TRAILER_LEN > limit:
            raise _Corrupt(f"block [{off}, +{size}) runs past the end of its region ({limit})", off)
        block = self.buf[off : off + size]
        kind = self.buf[off + size]
        stored = int.from_bytes(self.buf[off + size + 1 : off + size + 5], "little")
        actual = mask_crc(crc32c(self.buf[off : off + size + 1]))
        if stored != actual:
            raise ChecksumMismatchError(
                f"{self.path}: checksum mismatch in table block at offset {off}: "
                f"stored 0x{stored:08x}, computed 0x{actual:08x}"
            )
        if kind != 0:
            raise UnsupportedFormatError(
                f"{self.path}: table block at offset {off} is compressed (type {kind}); "
                "only uncompressed TensorBundle indexes are supported"
            )
        return block

    def _block_entries(self, block: bytes, base: int) -> Iterator[tuple[bytes, bytes]]:
        n = len(block)
        if n < 4:
            raise _Corrupt("block shorter than its restart count", base)
        restarts = int.from_bytes(block[n - 4 :], "little")
        if restarts > (n - 4) // 4:
            raise _Corrupt(f"restart count {restarts} does not fit the block", base + n - 4)
        end = n - 4 - 4 * restarts
        key = b""
        pos = 0
        while pos < end:
            at = pos
            shared, pos = _varint(block, pos, end, 32)
            non_shared, pos = _varint(block, pos, end, 32)
            vlen, pos = _varint(block, pos, end, 32)
            if shared > len(key):
                raise _Corrupt(f"entry shares {shared} bytes of a {len(key)}-byte key", base + at)
            if non_shared + vlen > end - pos:
                raise _Corrupt("entry runs past the end of its block", base + at)
            # limits before the key is built: its length, and all keys' bytes together
            klen = shared + non_shared
            if klen > _MAX_KEY_BYTES:
                raise _Corrupt(f"key of {klen} bytes (at most {_MAX_KEY_BYTES})", base + at)
            self.charge(klen, base + at)
            key = key[:shared] + block[pos : pos + non_shared]
            pos += non_shared
            yield key, block[pos : pos + vlen]
            pos += vlen
