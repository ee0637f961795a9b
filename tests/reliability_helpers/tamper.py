"""What an attacker with write access does to a checkpoint: change bytes *and* fix every crc32c.

crc32c detects accidents. Anyone who can write the files can also recompute the checksums, so
these helpers make changes that every crc check of the format accepts:

- :func:`rewrite_raw_value`: new bytes for an uncompressed value (codec none) in its shard, the
  entry's crc32c set to the crc of the new bytes, the block crc, the block-table crc, the header
  crc and its footer copy recomputed (FORMAT.md §3);
- :func:`replace_in_metadata`: replace a string of the same length in the index metadata (e.g. a
  digest of the manifest, §7.1) and recompute the metadata crc and the header crc.

Byte layout is read from docs/FORMAT.md; crc32c comes from the independent reference reader.
"""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reference_reader import crc32c  # noqa: E402  (tests/ is not a package)

ENTRY = 40
BLOCK = 24
BLOCK_ENTRIES = 64


def _u32(b: bytes | bytearray, at: int) -> int:
    return int(struct.unpack_from("<I", b, at)[0])


def _u64(b: bytes | bytearray, at: int) -> int:
    return int(struct.unpack_from("<Q", b, at)[0])


def _seal(b: bytearray) -> None:
    """Header crc over [0, 124) and its footer copy."""
    c = crc32c(bytes(b[:124]))
    struct.pack_into("<I", b, 124, c)
    struct.pack_into("<I", b, len(b) - 8, c)


def _shard_names(b: bytearray, shards_off: int, shard_count: int) -> list[str]:
    names = []
    for s in range(shard_count):
        at = shards_off + 64 * s
        n = _u32(b, at + 20)
        names.append(bytes(b[at + 24 : at + 24 + n]).decode())
    return names


def rewrite_raw_value(prefix: str, key: str, new: bytes) -> str:
    """Overwrite the stored bytes of uncompressed value ``key`` with ``new`` (same length) and
    patch every crc that covers it, so that crc checks pass. Returns the shard file changed."""
    ipath = prefix + ".index"
    with open(ipath, "rb") as f:
        b = bytearray(f.read())
    entry_count = _u64(b, 24)
    shard_count = _u32(b, 32)
    shards_off, blocks_off, entries_off = _u64(b, 40), _u64(b, 48), _u64(b, 56)
    keys_off, keys_len, aux_off, aux_len = _u64(b, 64), _u64(b, 72), _u64(b, 80), _u64(b, 88)
    nblocks = -(-entry_count // BLOCK_ENTRIES)
    key_lo = [_u64(b, blocks_off + BLOCK * k) for k in range(nblocks)]
    aux_lo = [_u64(b, blocks_off + BLOCK * k + 8) for k in range(nblocks)]
    want = key.encode()
    for i in range(entry_count):
        at = entries_off + ENTRY * i
        blk = i // BLOCK_ENTRIES
        start = keys_off + key_lo[blk] + _u32(b, at)
        if bytes(b[start : start + struct.unpack_from("<H", b, at + 4)[0]]) == want:
            break
    else:
        raise KeyError(key)
    if b[at + 7] != 0:
        raise ValueError(f"{key!r} is compressed; save it with compression='none'")
    shard, offset, stored_len = _u32(b, at + 12), _u64(b, at + 24), _u64(b, at + 32)
    if len(new) != stored_len:
        raise ValueError(f"{key!r} holds {stored_len} bytes, {len(new)} given")
    spath = prefix + _shard_names(b, shards_off, shard_count)[shard]
    with open(spath, "r+b") as f:
        f.seek(offset)
        f.write(new)
    struct.pack_into("<I", b, at + 16, crc32c(new))
    # The block's crc covers its entry records, key range and aux range (§3.2).
    lo, hi = blk * BLOCK_ENTRIES, min(entry_count, (blk + 1) * BLOCK_ENTRIES)
    k_end = key_lo[blk + 1] if blk + 1 < nblocks else keys_len
    a_end = aux_lo[blk + 1] if blk + 1 < nblocks else aux_len
    covered = (
        bytes(b[entries_off + ENTRY * lo : entries_off + ENTRY * hi])
        + bytes(b[keys_off + key_lo[blk] : keys_off + k_end])
        + bytes(b[aux_off + aux_lo[blk] : aux_off + a_end])
    )
    struct.pack_into("<I", b, blocks_off + BLOCK * blk + 16, crc32c(covered))
    struct.pack_into("<I", b, 116, crc32c(bytes(b[blocks_off : blocks_off + BLOCK * nblocks])))
    _seal(b)
    with open(ipath, "wb") as f:
        f.write(b)
    return spath


def replace_in_metadata(prefix: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (same length) in the index metadata; fix the metadata crc and
    the header crc."""
    if len(old) != len(new):
        raise ValueError("same length only (the index layout is not rebuilt)")
    ipath = prefix + ".index"
    with open(ipath, "rb") as f:
        b = bytearray(f.read())
    meta_off, meta_len = _u64(b, 96), _u64(b, 104)
    meta = bytes(b[meta_off : meta_off + meta_len])
    if meta.count(old.encode()) != 1:
        raise ValueError(f"{old!r} is not in the metadata exactly once")
    meta = meta.replace(old.encode(), new.encode())
    b[meta_off : meta_off + meta_len] = meta
    struct.pack_into("<I", b, 120, crc32c(meta))
    _seal(b)
    with open(ipath, "wb") as f:
        f.write(b)
