"""Generate the golden checkpoint of crc blocks (FORMAT.md §3.4) under
tests/golden/crc_blocks_v1/. Run from the repository root:

    .venv/bin/python tests/golden/gen_golden_crc_blocks.py

Two uncompressed values of more than one 16 KiB block, their data a function of the index
(``values()``, used by the tests too): a 2-d float32 value (dims in aux, then 4 block crcs)
and a 1-d int64 value (dims inline, 3 block crcs). The committed files are the contract
(tests/storage/test_golden_crc_blocks.py in Python, tests/golden_v1.rs in Rust); regenerate
only when the format version changes.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

import shardpoint as sp

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "crc_blocks_v1")


def values() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(12800, dtype=np.float32).reshape(100, 128),  # 51,200 B: 4 blocks
        "v": np.arange(5000, dtype=np.int64) * 3 - 7,  # 40,000 B: 3 blocks, dims inline
    }


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    sp.save_file(values(), os.path.join(OUT, "ck"), compression="none")


if __name__ == "__main__":
    main()
