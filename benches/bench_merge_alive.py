"""The merge from partials in memory at N ranks (FORMAT.md §8.4), timed in fresh processes, to
compare two builds side by side: this one and, with ``--before DIR`` (a copy of another build's
``python/`` directory, its ``_core`` included), that one, alternating. What it measures is the
coordinator's ``sp.merge(prefix, N, partials=..., wait_cleanup=False)``: since the robustness
pass that includes the check that the save is still alive (one listing of the directory).

    python benches/bench_merge_alive.py --n 4096 --rounds 6 --before /tmp/before/python

The N partials (one key each) are written once; every timed merge runs on a fresh copy of
them, in a process of its own (no order or buffer remembered from a previous merge).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "m" * 32


def _write(base: str, n: int) -> None:
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np

    import shardpoint as sp

    os.makedirs(os.path.join(base, "src"))
    prefix = os.path.join(base, "src", "ck")
    parts = []
    for r in range(n):
        w = sp.Writer(
            prefix, rank=r, world_size=n, merge_token=TOKEN, durable=False, compression=None
        )
        w.add(f"k{r:05d}", np.arange(4, dtype=np.int64))
        parts.append(w.commit_partial())
    with open(os.path.join(base, "parts.pkl"), "wb") as f:
        pickle.dump(parts, f)


def _merge_once(base: str, n: int) -> None:
    """(In a fresh process, with the build under test first on sys.path.)"""
    import shardpoint as sp

    with open(os.path.join(base, "parts.pkl"), "rb") as f:
        parts = pickle.load(f)  # noqa: S301 - bytes this bench wrote itself
    run = os.path.join(base, "run")
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(os.path.join(base, "src"), run)
    t, c = time.perf_counter(), time.process_time()
    sp.merge(os.path.join(run, "ck"), n, token=TOKEN, durable=False, partials=parts,
             wait_cleanup=False)  # fmt: skip
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    sp.wait_for_cleanups()
    print(f"{wall * 1000:.2f} {cpu * 1000:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--before", metavar="DIR", help="another build's python/ directory")
    args = ap.parse_args()
    builds = {"this": str(ROOT / "python")}
    if args.before:
        builds = {"before": args.before, **builds}
    base = tempfile.mkdtemp(prefix="sp-merge-alive-")
    try:
        _write(base, args.n)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in builds}
        for _ in range(args.rounds):
            for name, path in builds.items():
                env = {**os.environ, "PYTHONPATH": path}
                code = f"import sys; sys.path.insert(0, {str(ROOT / 'benches')!r}); "
                code += f"import bench_merge_alive as b; b._merge_once({base!r}, {args.n})"
                out = subprocess.run(
                    [sys.executable, "-c", code],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                got[name].append((float(out[0]), float(out[1])))
        for name, runs in got.items():
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            print(
                f"{name:6s} N={args.n} merge wall median {statistics.median(walls):.1f} ms "
                f"(min {min(walls):.1f}, max {max(walls):.1f}), CPU median "
                f"{statistics.median(cpus):.1f} ms over {len(runs)} fresh processes"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
