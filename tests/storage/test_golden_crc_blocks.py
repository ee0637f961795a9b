"""The golden checkpoint of crc blocks (tests/golden/crc_blocks_v1, made once by
tests/golden/gen_golden_crc_blocks.py; FORMAT.md §3.4) keeps reading: whole, in checked row
slices, with ``verify``, and with the reference reader, whose block crcs are recomputed here
from the values. The Rust side is tests/golden_v1.rs."""

from __future__ import annotations

import os
import sys

import numpy as np

import shardpoint as sp
from reference_reader import crc32c, read_checkpoint

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
sys.path.insert(0, HERE)
from gen_golden_crc_blocks import values  # noqa: E402 - after the path

PREFIX = os.path.join(HERE, "crc_blocks_v1", "ck")
BLOCK = 16384


def test_golden_crc_blocks_read() -> None:
    want = values()
    with sp.open(PREFIX) as r:
        r.verify()
        assert {k: r.info(k).crc_blocks for k in want} == {"w": 4, "v": 3}
        for key, value in want.items():
            assert np.array_equal(r[key], value), key
            n = len(value)
            for lo, hi in [(0, n), (1, 2), (n // 3, n - 1), (n - 1, n)]:
                assert np.array_equal(r.slice(key, lo, hi), value[lo:hi]), (key, lo, hi)
    ref = read_checkpoint(PREFIX)
    for key, value in want.items():
        raw = value.tobytes()
        assert ref.raw[key] == raw
        e = ref.entries[key]
        assert e.block_log2 == 14
        assert e.block_crcs == [crc32c(raw[i : i + BLOCK]) for i in range(0, len(raw), BLOCK)]
