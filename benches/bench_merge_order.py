"""The merge of an unchanged layout, heap against remembered order, side by side (docs/SCALE.md,
issue 42): N ranks write DCP's interleaved keys (``t{j}@{r},0``, one per rank and tensor) with
``sp.Writer``; the directory is kept aside and copied back before each merge; the merges
alternate between one with every remembered order forgotten (the k-way heap) and one in the
order remembered from the merge before (the same partials: an unchanged layout). Reports the
coordinator CPU of ``sp.merge`` (``time.process_time``, cleanup in the background as the DCP
StorageWriter of the harness does) per path: median and min over the rounds, with its user and
system halves and the page faults of the merge (``resource.getrusage``).

    python benches/bench_merge_order.py --n 4096 --rounds 5
    python benches/bench_merge_order.py --n 4096 --rounds 5 --before /tmp/before/python

``--before DIR``: the same partials merged, side by side, by another build of the package
(``DIR`` holds its ``shardpoint`` folder, e.g. a copy of main's ``python/``): each side merges
in its own fresh process, the sides alternating round by round, so a change is measured
against the code it replaces under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench"


def _import(pkg_dir: str) -> Any:
    sys.path.insert(0, pkg_dir)
    import shardpoint as sp

    return sp


def write_partials(src: Path, n: int, tensors: int) -> None:
    import numpy as np

    sp = _import(str(ROOT / "python"))

    def rank(r: int) -> None:
        with sp.Writer(
            str(src / "ckpt"),
            rank=r,
            world_size=n,
            compression="none",
            merge_token=TOKEN,
            durable=False,
        ) as w:
            for j in range(tensors):
                w.add(f"t{j:03d}@{r},0", np.full(4, r, dtype=np.float32))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(rank, range(n)))


def merges(pkg_dir: str, src: Path, work: Path, n: int, rounds: int) -> list[dict[str, Any]]:
    """``2 * rounds + 1`` merges of the partials in ``src`` (copied to ``work`` each time) in
    this process: the first remembers the order (not reported), then heap and in order
    alternate. One row per reported merge."""
    sp = _import(pkg_dir)
    from shardpoint import _core

    rows = []
    for i in range(2 * rounds + 1):
        path = "heap" if i % 2 == 1 else "in order"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        if path == "heap":
            _core.forget_merge_orders()
        before = _core.merge_order_stats()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), os.times()
        c0 = time.process_time()
        sp.merge(str(work / "ckpt"), n, token=TOKEN, wait_cleanup=False)
        cpu = time.process_time() - c0
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), os.times()
        sp.wait_for_cleanups()
        took_order = _core.merge_order_stats()[0] > before[0]
        assert took_order == (path == "in order" and i > 0), (i, path, took_order)
        if i > 0:
            rows.append(
                {
                    "path": path,
                    "cpu": cpu,
                    "user": t1.user - t0.user,
                    "sys": t1.system - t0.system,
                    "faults": r1.ru_minflt - r0.ru_minflt,
                }
            )
    return rows


def report(side: str, n: int, tensors: int, rows: list[dict[str, Any]]) -> None:
    for path in ("heap", "in order"):
        got = [r for r in rows if r["path"] == path]
        med = {k: statistics.median(r[k] for r in got) for k in ("cpu", "user", "sys", "faults")}
        print(
            f"{side:6s} N={n} tensors={tensors} {path:8s} merge_cpu median={med['cpu']:.3f}s "
            f"min={min(r['cpu'] for r in got):.3f}s (user {med['user']:.3f} sys {med['sys']:.3f}) "
            f"page_faults={med['faults']:.0f} merges={len(got)}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="ranks")
    ap.add_argument("--tensors", type=int, default=100, help="tensors per rank")
    ap.add_argument("--rounds", type=int, default=5, help="merges per path (and side)")
    ap.add_argument("--before", help="a python/ folder of the build to compare against")
    ap.add_argument("--child", nargs=3, metavar=("PKG", "SRC", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.n
    if args.child:
        pkg, src, work = args.child
        print(json.dumps(merges(pkg, Path(src), Path(work), n, args.rounds)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_merge_order-"))
    try:
        src = tmp / "src"
        src.mkdir()
        write_partials(src, n, args.tensors)
        if not args.before:
            rows = merges(str(ROOT / "python"), src, tmp / "work", n, args.rounds)
            report("this", n, args.tensors, rows)
        else:
            # one fresh process per side and round, the sides alternating
            got: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for _ in range(args.rounds):
                for side, pkg in (("before", args.before), ("after", str(ROOT / "python"))):
                    cmd = [sys.executable, __file__, "--n", str(n), "--rounds", "2"]
                    cmd += ["--child", pkg, str(src), str(tmp / "work")]
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                    got[side] += json.loads(out.strip().splitlines()[-1])
            for side, rows in got.items():
                report(side, n, args.tensors, rows)
        print(f"load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
