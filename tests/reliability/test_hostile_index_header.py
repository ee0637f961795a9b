"""Forged index headers that would hide keys (FORMAT.md §3, issue 36 part 4).

Every crc of these files is right: the header is rewritten and resealed (header crc, footer
copy, block-table crc), so only the header's consistency with the rest of the index can tell.
Open checks it (entry count against the key blob, sections back to back but for alignment
padding) without reading any entry, so a file that would list fewer keys than it holds is
refused at open instead of read as a smaller checkpoint; and a key listing proves the table
sorted as lookups do.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers import craft
from shardpoint import _core


def _save(tmp_path, n: int) -> str:
    p = str(tmp_path / f"ck{n}")
    sp.save_file({f"k{i:05d}": np.full(2, i, dtype=np.int16) for i in range(n)}, p, durable=False)
    return p


def _forge_count(p: str, n: int) -> None:
    """Set the index's entry count to ``n``, recomputing the block-table crc over the table
    that count implies, the header crc and its footer copy."""
    with open(p + ".index", "rb") as f:
        b = bytearray(f.read())
    blocks_off = struct.unpack_from("<Q", b, 48)[0]
    blocks = bytes(b[blocks_off : blocks_off + 24 * -(-n // 64)])
    struct.pack_into("<I", b, 116, _core.crc32c(blocks))
    craft.set_header(b, {"entry_count": n})
    with open(p + ".index", "wb") as f:
        f.write(b)


@pytest.mark.parametrize(
    ("keys", "forged"),
    [
        (3, 0),  # every key hidden, small index (read whole at open)
        (3000, 0),  # every key hidden, large index (read on demand)
        (3000, 2944),  # the last block (56 keys) dropped
        (3000, 2999),  # one key dropped
    ],
)
def test_an_understated_entry_count_is_refused_at_open(tmp_path, keys, forged) -> None:
    p = _save(tmp_path, keys)
    _forge_count(p, forged)
    with pytest.raises(sp.CorruptCheckpointError, match=r"ck\d+\.index"):
        sp.open(p)
    with pytest.raises(sp.CorruptCheckpointError):
        sp.load_file(p)


def test_the_forgery_helper_keeps_an_honest_count_valid(tmp_path) -> None:
    """``_forge_count`` with the true count rewrites a valid file: the refusals above come
    from the count alone."""
    p = _save(tmp_path, 3000)
    _forge_count(p, 3000)
    with sp.open(p) as r:
        assert len(r.keys()) == 3000
        r.verify()


def test_listing_keys_of_blocks_out_of_order_raises(tmp_path) -> None:
    """130 entries written block 1 first (each block sorted, the table not, every crc right):
    a lookup of a key reports the corruption, and so does ``keys()`` (it used to list them)."""
    es = [craft.raw_entry(f"k{i:04d}".encode(), "uint8", [1], bytes([i])) for i in range(130)]
    order = es[64:128] + es[:64] + es[128:]
    p = str(tmp_path / "ck")
    craft.write_checkpoint(p, order)
    with sp.open(p) as r:
        with pytest.raises(sp.CorruptCheckpointError, match="not sorted across blocks"):
            r.keys()
        with pytest.raises(sp.CorruptCheckpointError, match="not sorted across blocks"):
            "k0000" in r  # noqa: B015 - the lookup is the test
    with pytest.raises(sp.CorruptCheckpointError):
        sp.load_file(p)
    craft.write_checkpoint(p, es)
    assert len(sp.open(p).keys()) == 130
