"""Payload decoders of the reference reader (:mod:`reference_reader`): zstd frames decoded to an
exact length, byte-grouped zstd and byte-grouped Huffman planes (docs/FORMAT.md §5), each
failure a :class:`FormatError` naming the file and offset."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zstandard

from reference_spec import FormatError, _u32, byte_ungroup, group_width

if TYPE_CHECKING:
    from reference_reader import EntryRecord


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
