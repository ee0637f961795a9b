"""Build TensorBundle indexes (LevelDB tables) entry by entry, for hostile-input tests.

An entry is given as ``(shared, suffix, value)``: it shares ``shared`` bytes of the previous
key and adds ``suffix`` (prefix compression, as LevelDB writes it). Everything goes in one data
block behind the header entry (key ``""``, ``num_shards = 1``); block trailers and crcs are
right, so only the reader's budget and consistency checks can refuse what is built.
"""

from __future__ import annotations

from collections.abc import Iterable

from reference_reader import crc32c

TABLE_MAGIC = 0xDB4775248B80FB57
#: BundleHeaderProto {num_shards: 1}
HEADER = b"\x08\x01"
#: BundleEntryProto of a convertible empty tensor: dtype float32, shape [0], size 0, and the
#: masked crc32c of no bytes
EMPTY_F32 = b"\x08\x01\x12\x04\x12\x02\x08\x00\x35" + (0xA282EAD8).to_bytes(4, "little")
#: BundleEntryProto of an entry that is skipped: dtype DT_STRING, shape []
STRING = b"\x08\x07"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _framed(out: bytearray, block: bytes) -> bytes:
    """Append ``block`` with its trailer (type 0, masked crc32c); return its BlockHandle."""
    handle = varint(len(out)) + varint(len(block))
    out += block + b"\0" + _mask(crc32c(block + b"\0")).to_bytes(4, "little")
    return handle


def index_of(entries: Iterable[tuple[int, bytes, bytes]]) -> bytes:
    """The bytes of a TensorBundle index holding the header entry, then ``entries``."""
    blk = bytearray(varint(0) + varint(0) + varint(len(HEADER)) + HEADER)
    for shared, suffix, value in entries:
        blk += varint(shared) + varint(len(suffix)) + varint(len(value)) + suffix + value
    blk += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart at 0
    out = bytearray()
    data = _framed(out, bytes(blk))
    meta = _framed(out, (0).to_bytes(4, "little") + (1).to_bytes(4, "little"))
    sep = b"\xff"
    index_block = varint(0) + varint(len(sep)) + varint(len(data)) + sep + data
    index_block += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")
    idx = _framed(out, index_block)
    return bytes(out + (meta + idx).ljust(40, b"\0") + TABLE_MAGIC.to_bytes(8, "little"))


def long_keys(count: int, base: bytes, value: bytes) -> bytes:
    """``count`` keys ``base`` + 2 bytes, each sharing all but the last two bytes of the
    previous one (a few bytes of index per key): only the first is written out in full."""
    assert count <= 94 * 94

    def entries() -> Iterable[tuple[int, bytes, bytes]]:
        for i in range(count):
            tail = bytes([0x21 + i // 94, 0x21 + i % 94])  # printable, increasing
            yield (0, base + tail, value) if i == 0 else (len(base), tail, value)

    return index_of(entries())


def tiny_keys(count: int, value: bytes) -> bytes:
    """``count`` short keys (4 bytes of key each, 3 of them shared): many entries per byte."""

    def entries() -> Iterable[tuple[int, bytes, bytes]]:
        for i in range(count):
            key = (0x21 + i // (94**3)).to_bytes(1, "little") + bytes(
                [0x21 + (i // 94**2) % 94, 0x21 + (i // 94) % 94, 0x21 + i % 94]
            )
            yield 0, key, value

    return index_of(entries())
