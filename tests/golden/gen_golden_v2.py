"""Generate the index-version-2 golden checkpoint under tests/golden/v2/: the values, metadata
and options of v1's ``mixed`` (gen_golden.py), saved with hashed shard names (FORMAT.md
§3.1.1), so ``v2/mixed.index`` + ``v2/mixed/HH/data-…``. Its expectation is v1's ``mixed`` in
tests/golden/expected_v1.json (same values, codecs and shard numbers). Run from the repository
root:

    .venv/bin/python tests/golden/gen_golden_v2.py

The committed files are the contract (tests/storage/test_golden.py, tests/golden_v1.rs): a later
version of shardpoint must keep reading them. Regenerate only if the v2 form itself changes.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np

import shardpoint as sp

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "v2")


def main() -> None:
    sys.path.insert(0, HERE)
    from gen_golden import CHECKPOINTS, tensors

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    kwargs, metadata = CHECKPOINTS["mixed"]
    prefix = os.path.join(OUT, "mixed")
    # numpy scalars as 0-d arrays: stored as tensors, as v1's files (written before scalars
    # became object entries) hold them
    values = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in tensors().items()}
    sp.save_file(values, prefix, metadata=metadata, durable=False, hashed_prefixes=True, **kwargs)
    files = sorted(
        os.path.relpath(os.path.join(root, f), OUT) for root, _, fs in os.walk(OUT) for f in fs
    )
    print("\n".join(files), file=sys.stderr)


if __name__ == "__main__":
    main()
