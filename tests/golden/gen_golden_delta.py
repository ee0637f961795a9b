"""Generate the golden delta checkpoints (FORMAT.md §11) under tests/golden/delta_v1/ and their
expectation file tests/golden/expected_delta_v1.json. Run from the repository root:

    .venv/bin/python tests/golden/gen_golden_delta.py

A chain of three checkpoints: ``base`` (no table), ``step1`` (a delta of ``base``: ``same``,
``xor`` and whole keys) and ``step2`` (a delta of ``step1``: depth 2, a key resolved through two
links). The data is fixed and seeded. The committed files are the contract: a later version of
shardpoint must keep reading them (tests/delta/test_delta_golden.py, through ``sp.load_file`` and
through the independent reference reader). Regenerate only with a new table version (then as
delta_v2/, keeping delta_v1/).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import ml_dtypes
import numpy as np

import shardpoint as sp
import shardpoint.delta as spd

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "delta_v1")
EXPECTED = os.path.join(HERE, "expected_delta_v1.json")
NAMES = ("base", "step1", "step2")


def states() -> list[dict[str, object]]:
    """The three states of the chain."""
    rng = np.random.default_rng(20260601)
    w = (rng.standard_normal((64, 128)) * 0.05).astype(np.float32)  # 32 KiB: xor when sparse
    e = (rng.standard_normal((96, 128)) * 0.1).astype(ml_dtypes.bfloat16)  # 24 KiB bf16
    frozen = rng.standard_normal(2048).astype(np.float32)  # never changes: same
    s0: dict[str, object] = {
        "net/w": w, "net/emb": e, "net/frozen": frozen,
        "net/bias": np.linspace(-1, 1, 32, dtype=np.float32),  # small: whole when changed
        "ints/step": np.array([0], np.int64), "meta/note": "golden delta v1",
    }  # fmt: skip
    s1 = dict(s0)
    w1 = w.copy()
    w1.reshape(-1)[::97] += 1e-3  # ~1% of elements
    e1 = e.copy()
    e1[::16, ::8] = (e1[::16, ::8].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)
    s1.update({"net/w": w1, "net/emb": e1, "net/bias": s0["net/bias"] + np.float32(0.5),  # type: ignore[operator]
               "ints/step": np.array([1], np.int64)})  # fmt: skip
    s2 = dict(s1)
    w2 = w1.copy()
    w2.reshape(-1)[5::101] -= 2e-3
    s2.update({"net/w": w2, "ints/step": np.array([2], np.int64), "net/new": np.arange(6.0)})
    return [s0, s1, s2]


def main() -> None:
    sys.path.insert(0, os.path.dirname(HERE))  # tests/, for the reference reader
    import reference_reader_delta as rd

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    expected: dict[str, object] = {"table_version": 1, "checkpoints": {}}
    prev = None
    for name, state in zip(NAMES, states(), strict=True):
        prefix = os.path.join(OUT, name)
        if prev is None:
            sp.save_file(state, prefix, durable=False)
        else:
            sp.save_file(state, prefix, base=prev, delta=True, durable=False)
        prev = prefix
        resolved = rd.read_resolved(prefix)
        info = spd.describe(prefix)
        modes = {k: v["mode"] for k, v in info.get("tensors", {}).items()}
        entries = {}
        for key, (dtype, dims, raw) in sorted(resolved.items()):
            entries[key] = {"dtype": dtype, "dims": list(dims), "mode": modes.get(key, "full"),
                            "sha256": hashlib.sha256(raw).hexdigest()}  # fmt: skip
        expected["checkpoints"][name] = {  # type: ignore[index]
            "files": sorted(f for f in os.listdir(OUT) if f.startswith(name + ".")),
            "depth": info.get("depth", 0),
            "base_digest": info.get("base_digest"),
            "entries": entries,
        }
    with open(EXPECTED, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, under {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
