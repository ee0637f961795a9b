"""What crc blocks (FORMAT.md §3.4) cost ordinary saves and loads, side by side with a build
without them, in alternating child processes (the machine is noisy: ratios of one run count).

    python benches/bench_crc_blocks.py --baseline /tmp/old/python   # a checkout's python/ dir
                                                                    # with its _core built

Per build, best of ``--repeat``: ``save_file`` of uncompressed float32 tensors (prefix and
single file), the index size, ``load_file`` (whole values, zero-copy views touched) of both,
and checked row slices of every tensor. The data stays in the page cache (a warm load: the
crc work is what differs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(out_dir: str, mib: int, count: int, repeat: int) -> dict[str, float]:
    import numpy as np

    import shardpoint as sp

    rows = mib * (1 << 20) // (4 * 1024)
    rng = np.random.default_rng(0)
    tree = {f"t{i:03d}": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(count)}
    best: dict[str, float] = {}

    def timed(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        fn()
        best[name] = min(best.get(name, 1e9), time.perf_counter() - t)

    prefix, single = os.path.join(out_dir, "ck"), os.path.join(out_dir, "one.sp")

    def touch(values: dict) -> None:  # type: ignore[type-arg]
        for v in values.values():
            float(v.reshape(-1)[:: 1 << 10].sum())  # every page of a zero-copy view

    for _ in range(repeat):
        timed("save_prefix_s", lambda: sp.save_file(tree, prefix, compression="none"))
        timed("save_single_s", lambda: sp.save_file(tree, single, compression="none"))
        timed("load_prefix_s", lambda: touch(sp.load_file(prefix)))
        timed("load_single_s", lambda: touch(sp.load_file(single)))

        def slices() -> None:
            with sp.open(prefix) as r:
                for k in tree:
                    r.slice(k, rows // 3 + 1, 2 * rows // 3 - 1)

        timed("slices_s", slices)
    best["index_bytes"] = float(os.path.getsize(prefix + ".index"))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline", required=True, help="python/ dir of a build without blocks")
    ap.add_argument("--mib", type=int, default=16, help="MiB per tensor")
    ap.add_argument("--count", type=int, default=16, help="tensors")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two builds")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.mib, args.count, args.repeat)))
        return
    builds = {"baseline": args.baseline, "this": str(ROOT / "python")}
    results: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, path in builds.items():
            with tempfile.TemporaryDirectory() as d:
                cmd = [sys.executable, __file__, "--baseline", "-", "--child", d]
                cmd += ["--mib", str(args.mib), "--count", str(args.count)]
                cmd += ["--repeat", str(args.repeat)]
                env = dict(os.environ, PYTHONPATH=path)
                got = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                                text=True).stdout)  # fmt: skip
            mine = results.setdefault(name, {})
            for k, v in got.items():
                mine[k] = min(mine.get(k, 1e9), v)
    total = args.mib * args.count
    print(f"{args.count} x {args.mib} MiB uncompressed float32 ({total} MiB), best of "
          f"{args.repeat} x {args.rounds} rounds")  # fmt: skip
    for k in results["this"]:
        a, b = results["baseline"][k], results["this"][k]
        unit = "B" if k.endswith("bytes") else "s"
        print(f"{k:14s} baseline {a:10.4f} {unit}  this {b:10.4f} {unit}  ratio {b / a:.3f}")


if __name__ == "__main__":
    main()
