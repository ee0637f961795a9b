"""Build shard and index files byte by byte from docs/FORMAT.md, with every crc recomputed.

Hostile-input tests need files that are wrong in exactly one *semantic* way (an offset past the
end, an overflowing shape, unsorted keys...) while every checksum is right, so that the reader's
bounds and consistency checks are what refuses them. This module is a second, deliberately
permissive writer: it lays out exactly what it is given (no sorting, no validation) and then
computes header crc, shard/block table crcs, block crcs and metadata crc over the result.
Header fields can be overridden after layout (``header``), in which case only the header crc
and its footer copy are recomputed.

It imports neither ``shardpoint`` nor its ``_core``; crc32c comes from the independent
reference reader.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field

import zstandard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reference_reader import crc32c  # noqa: E402  (tests/ is not a package)

DATA_START = 4096
ALIGN = 64
PAGE = 4096
PAGE_ALIGN_MIN = 65536
BLOCK_ENTRIES = 64

DTYPE_TAGS = {
    "bool": (1, 1),
    "int8": (2, 1),
    "int16": (3, 2),
    "int32": (4, 4),
    "int64": (5, 8),
    "uint8": (6, 1),
    "uint16": (7, 2),
    "uint32": (8, 4),
    "uint64": (9, 8),
    "float16": (10, 2),
    "bfloat16": (11, 2),
    "float32": (12, 4),
    "float64": (13, 8),
    "complex64": (14, 8),
    "complex128": (15, 16),
}
CODEC_TAGS = {"none": 0, "zstd": 1, "zstd-bytegroup": 2}
KIND_TAGS = {"tensor": 0, "bytes": 1, "str": 2, "int": 3, "float": 4, "json": 5, "object": 6}

HEADER_FIELDS = {
    # name: (offset, struct format) of the index header (§3)
    "magic": (0, "8s"),
    "format_version": (8, "<I"),
    "header_len": (12, "<I"),
    "file_len": (16, "<Q"),
    "entry_count": (24, "<Q"),
    "shard_count": (32, "<I"),
    "chunk_bytes": (36, "<I"),
    "shards_off": (40, "<Q"),
    "blocks_off": (48, "<Q"),
    "entries_off": (56, "<Q"),
    "keys_off": (64, "<Q"),
    "keys_len": (72, "<Q"),
    "aux_off": (80, "<Q"),
    "aux_len": (88, "<Q"),
    "meta_off": (96, "<Q"),
    "meta_len": (104, "<Q"),
}


@dataclass
class CEntry:
    """One entry as it will be written: nothing is checked or derived unless left ``None``."""

    key: bytes
    dtype: str = "uint8"
    codec: str = "none"
    kind: str = "tensor"
    dims: list[int] = field(default_factory=list)
    payload: bytes = b""  # stored bytes, written to the entry's shard at an aligned offset
    #: chunk records (rel_offset, stored_len, crc); None = no chunk table (codec none)
    chunks: list[tuple[int, int, int]] | None = None
    crc: int | None = None  # crc32c of the raw bytes; None = crc32c(raw) where raw is given
    raw: bytes | None = None  # raw bytes (for the entry crc) when different from payload
    shard: int = 0
    ndim: int | None = None  # None = len(dims)
    offset: int | None = None  # None = where the writer puts the payload
    stored_len: int | None = None  # None = len(payload)
    inline_dims: bool | None = None  # None = the spec's rule (codec none and ndim 1)
    reserved: bytes = b"\0\0"  # byte 10 is crc_block_log2 (FORMAT.md §3.4)
    #: block crcs after dims (§3.4); None = no table
    block_crcs: list[int] | None = None


@dataclass
class CShard:
    """One shard record; ``None`` fields are taken from the shard file written."""

    name: bytes = b".data-00000-of-00001"
    token: int = 0x1234_5678_9ABC_DEF0
    file_len: int | None = None
    header_crc: int | None = None
    name_len: int | None = None


def shard_header(token: int, index: int = 0, count: int = 1) -> bytes:
    """The 64-byte shard header (§2) with its crc."""
    b = bytearray(64)
    b[0:8] = b"SPSHARD\0"
    struct.pack_into("<IIQII", b, 8, 1, 64, token, index, count)
    struct.pack_into("<I", b, 60, crc32c(bytes(b[:60])))
    return bytes(b)


def zstd_frame(raw: bytes, level: int = 3) -> bytes:
    """One zstd frame of ``raw`` (content size recorded, as the Rust writer does)."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)


def chunk_entry(
    key: bytes, dtype: str, dims: list[int], raw: bytes, chunk_bytes: int, codec: str = "zstd"
) -> CEntry:
    """A valid compressed entry: every chunk one zstd frame (or raw when it does not shrink)."""
    assert codec == "zstd", "byte-grouped chunks are built by hand where needed"
    payload = bytearray()
    chunks = []
    for lo in range(0, len(raw), chunk_bytes):
        piece = raw[lo : lo + chunk_bytes]
        frame = zstd_frame(piece)
        stored = frame if len(frame) < len(piece) else piece
        chunks.append((len(payload), len(stored), crc32c(stored)))
        payload += stored
    return CEntry(key, dtype, codec, "tensor", dims, bytes(payload), chunks, raw=raw)


def _place(pos: int, n: int) -> int:
    a = PAGE if n >= PAGE_ALIGN_MIN else ALIGN
    return (pos + a - 1) // a * a


def write_shards(prefix: str, entries: list[CEntry], shards: list[CShard]) -> None:
    """Write every shard file; fills in entry offsets and shard record defaults."""
    for si, s in enumerate(shards):
        data = bytearray(shard_header(s.token, si, len(shards)))
        data += bytes(DATA_START - len(data))
        for e in entries:
            if e.shard != si or not e.payload:
                if e.shard == si and e.offset is None:
                    e.offset = _place(len(data), 0)
                continue
            at = _place(len(data), len(e.payload))
            data += bytes(at - len(data))
            data += e.payload
            if e.offset is None:
                e.offset = at
        name = s.name.decode("latin-1")
        if "/" not in name and "\0" not in name:  # hostile names are never written to disk
            with open(prefix + name, "wb") as f:
                f.write(data)
        if s.file_len is None:
            s.file_len = len(data)
        if s.header_crc is None:
            s.header_crc = struct.unpack_from("<I", data, 60)[0]


def _aux_of(e: CEntry) -> bytes:
    inline = (
        e.inline_dims if e.inline_dims is not None else (e.codec == "none" and len(e.dims) == 1)
    )
    out = b"" if inline else b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in e.dims)
    for rel, sl, c in e.chunks or []:
        out += struct.pack("<QII", rel, sl, c)
    for c in e.block_crcs or []:
        out += struct.pack("<I", c)
    return out


def build_index(
    entries: list[CEntry],
    shards: list[CShard],
    *,
    chunk_bytes: int = 4096,
    meta: bytes = b'{"format":1,"writer":"craft","user":{}}',
    header: dict[str, int | bytes] | None = None,
) -> bytes:
    """Serialize an index (§3) of ``entries`` in the order given, all crcs recomputed."""
    n = len(entries)
    nblocks = -(-n // BLOCK_ENTRIES)
    shards_off = 128
    blocks_off = shards_off + 64 * len(shards)
    entries_off = blocks_off + 24 * nblocks
    keys = b"".join(e.key for e in entries)
    auxes = [_aux_of(e) for e in entries]
    keys_off = entries_off + 40 * n
    aux_off = keys_off + len(keys)
    aux = b"".join(auxes)
    meta_off = aux_off + len(aux)
    file_len = meta_off + len(meta) + 16
    b = bytearray(file_len)
    for i, s in enumerate(shards):
        at = shards_off + 64 * i
        name_len = s.name_len if s.name_len is not None else len(s.name)
        struct.pack_into("<QQII", b, at, s.file_len or 0, s.token, s.header_crc or 0, name_len)
        b[at + 24 : at + 24 + min(len(s.name), 40)] = s.name[:40]
    kpos = apos = 0
    for blk in range(nblocks):
        key_lo, aux_lo = kpos, apos
        lo, hi = blk * BLOCK_ENTRIES, min(n, (blk + 1) * BLOCK_ENTRIES)
        for i in range(lo, hi):
            e = entries[i]
            at = entries_off + 40 * i
            struct.pack_into(
                "<IHBBBB",
                b,
                at,
                kpos - key_lo,
                len(e.key) & 0xFFFF,
                DTYPE_TAGS[e.dtype][0] if isinstance(e.dtype, str) else e.dtype,
                CODEC_TAGS[e.codec] if isinstance(e.codec, str) else e.codec,
                KIND_TAGS[e.kind] if isinstance(e.kind, str) else e.kind,
                e.ndim if e.ndim is not None else len(e.dims),
            )
            b[at + 10 : at + 12] = e.reserved
            raw = e.raw if e.raw is not None else e.payload
            crc = e.crc if e.crc is not None else crc32c(raw)
            stored_len = e.stored_len if e.stored_len is not None else len(e.payload)
            struct.pack_into(
                "<IIIQQ", b, at + 12, e.shard, crc, apos - aux_lo, e.offset or 0, stored_len
            )
            kpos += len(e.key)
            apos += len(auxes[i])
        ent = bytes(b[entries_off + 40 * lo : entries_off + 40 * hi])
        c = crc32c(ent + keys[key_lo:kpos] + aux[aux_lo:apos])
        struct.pack_into("<QQII", b, blocks_off + 24 * blk, key_lo, aux_lo, c, 0)
    b[keys_off:aux_off] = keys
    b[aux_off:meta_off] = aux
    b[meta_off : meta_off + len(meta)] = meta
    h = {
        "magic": b"SPINDEX\0",
        "format_version": 1,
        "header_len": 128,
        "file_len": file_len,
        "entry_count": n,
        "shard_count": len(shards),
        "chunk_bytes": chunk_bytes,
        "shards_off": shards_off,
        "blocks_off": blocks_off,
        "entries_off": entries_off,
        "keys_off": keys_off,
        "keys_len": len(keys),
        "aux_off": aux_off,
        "aux_len": len(aux),
        "meta_off": meta_off,
        "meta_len": len(meta),
    }
    for k, (at, fmt) in HEADER_FIELDS.items():
        struct.pack_into(fmt, b, at, h[k])
    struct.pack_into(
        "<III",
        b,
        112,
        crc32c(bytes(b[shards_off:blocks_off])),
        crc32c(bytes(b[blocks_off:entries_off])),
        crc32c(meta),
    )
    _seal(b)
    if header:
        set_header(b, header)
    return bytes(b)


def _seal(b: bytearray) -> None:
    """Recompute the header crc and its footer copy (§3)."""
    c = crc32c(bytes(b[:124]))
    struct.pack_into("<I", b, 124, c)
    n = len(b)
    b[n - 16 : n - 8] = b"SPINDEND"
    struct.pack_into("<II", b, n - 8, c, 0)


def set_header(b: bytearray, fields: dict[str, int | bytes]) -> None:
    """Overwrite index header fields, then reseal (header crc + footer copy)."""
    for k, v in fields.items():
        at, fmt = HEADER_FIELDS[k]
        struct.pack_into(fmt, b, at, v)
    _seal(b)


def write_checkpoint(
    prefix: str,
    entries: list[CEntry],
    shards: list[CShard] | None = None,
    **index_kw: object,
) -> None:
    """Shards then index of a crafted checkpoint at ``prefix``."""
    shards = shards if shards is not None else [CShard()]
    write_shards(prefix, entries, shards)
    with open(prefix + ".index", "wb") as f:
        f.write(build_index(entries, shards, **index_kw))  # type: ignore[arg-type]


def raw_entry(key: bytes, dtype: str, dims: list[int], raw: bytes, kind: str = "tensor") -> CEntry:
    """A valid uncompressed entry."""
    return CEntry(key, dtype, "none", kind, list(dims), raw)
