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
import os
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reference_codecs import (  # tests/ is not a package: its own modules
    _decode_bytegroup,
    _decode_bytegroup_huffman,
    _zstd_exact,
)
from reference_crc import _update_py, crc32c  # noqa: F401  (_update_py: tests use it)
from reference_spec import (
    _FLOAT_RE,
    _HASHED_NAME_RE,
    _INT_RE,
    _SHARD_NAME_RE,
    ALIGN,
    BLOCK_ENTRIES,
    BLOCK_REC,
    CHUNK_REC,
    CODECS,
    DATA_START,
    DTYPES,
    ENTRY_REC,
    FORMAT_VERSION,
    INDEX_FOOTER_LEN,
    INDEX_FOOTER_MAGIC,
    INDEX_HEADER_LEN,
    INDEX_MAGIC,
    INDEX_VERSION_HASHED,
    JSON_MAX_DEPTH,
    KINDS,
    MAX_NDIM,
    PAGE,
    PAGE_ALIGN_MIN,
    SHARD_HEADER_LEN,
    SHARD_MAGIC,
    SHARD_NAME_FIELD,
    SHARD_REC,
    U64_MAX,
    ChecksumError,
    FormatError,
    _check_crc,
    _u16,
    _u32,
    _u64,
    byte_group,
    byte_ungroup,
    numpy_dtype,
)

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
    block_log2: int = 0  # crc blocks of an uncompressed value (FORMAT.md §3.4); 0: none
    block_crcs: list[int] = field(default_factory=list)
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
    version = _u32(b, 8)
    if version not in (FORMAT_VERSION, INDEX_VERSION_HASHED):
        raise FormatError(path, 8, f"unsupported format_version {version}")
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
        if not _SHARD_NAME_RE.fullmatch(name) and not (
            version == INDEX_VERSION_HASHED and _hashed_name_ok(name)
        ):
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
    if r[11]:
        raise FormatError(path, at + 11, f"{where}: reserved byte is not zero")
    dtype, itemsize = DTYPES[dtype_t]
    codec, kind = CODECS[codec_t], KINDS[kind_t]
    block_log2 = r[10]  # §3.4
    if block_log2 and (codec != "none" or not 12 <= block_log2 <= 24):
        raise FormatError(path, at + 10, f"{where}: crc_block_log2 {block_log2} on {codec}")
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
    block_crcs: list[int] = []
    if codec == "none":
        if stored_len != raw_len:
            raise FormatError(path, at + 32, f"{where}: stored_len {stored_len} != raw {raw_len}")
        if block_log2:
            if raw_len == 0:
                raise FormatError(path, at + 10, f"{where}: crc blocks on an empty value")
            nb = -(-raw_len // (1 << block_log2))
            if pos + 4 * nb > len(aux):
                raise FormatError(path, at + 20, f"{where}: crc blocks outside the aux range")
            block_crcs = list(struct.unpack_from(f"<{nb}I", aux, pos))
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
        block_log2=block_log2,
        block_crcs=block_crcs,
    )


def _decode_payload(e: EntryRecord, shard_path: str, data: bytes, cb: int) -> bytes:
    payload = data[e.offset : e.offset + e.stored_len]
    if e.codec == "none":
        raw = payload
        size = 1 << e.block_log2
        for k, want in enumerate(e.block_crcs):
            where = f"key {e.key!r} crc block {k}"
            _check_crc(shard_path, e.offset + k * size, where, want, raw[k * size : (k + 1) * size])
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


def _hashed_name_ok(name: bytes) -> bool:
    """§3.1.1: ``/HH/data-SSSSS-of-NNNNN[.token]`` whose HH is the low byte of the crc32c
    of the plain name ``.data-SSSSS-of-NNNNN``, as two lowercase hex digits."""
    m = _HASHED_NAME_RE.fullmatch(name)
    if m is None:
        return False
    return int(m.group(1), 16) == crc32c(b".data-" + m.group(2)) & 0xFF


def read_index(prefix: str | os.PathLike[str]) -> dict[str, EntryRecord]:
    """Parse and check ``P.index`` only (no shard is opened): the entry records by key."""
    _, _, entries, _ = _parse_index(os.fspath(prefix))
    return {e.key: e for e in entries}


def load(prefix: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(values, user metadata)`` of checkpoint ``prefix``, fully verified."""
    ck = read_checkpoint(prefix)
    return ck.values, ck.user_metadata
