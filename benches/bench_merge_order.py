"""The merge of an unchanged layout, heap against remembered order, side by side (docs/SCALE.md,
issue 42): N ranks write DCP's interleaved keys (``t{j}@{r},0``, one per rank and tensor) with
``sp.Writer``; the directory is kept aside and copied back before each merge; the merges
alternate between one with every remembered order forgotten (the k-way heap) and one in the
order remembered from the merge before (the same partials: an unchanged layout). Reports the
coordinator CPU of ``sp.merge`` (``time.process_time``, cleanup in the background as the DCP
StorageWriter of the harness does) per path: median and min over the rounds.

    python benches/bench_merge_order.py --n 4096 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import shardpoint as sp  # noqa: E402
from shardpoint import _core  # noqa: E402

TOKEN = "bench"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="ranks")
    ap.add_argument("--tensors", type=int, default=100, help="tensors per rank")
    ap.add_argument("--rounds", type=int, default=5, help="merges per path")
    args = ap.parse_args()
    n = args.n
    tmp = Path(tempfile.mkdtemp(prefix="bench_merge_order-"))
    try:
        src = tmp / "src"
        src.mkdir()

        def rank(r: int) -> None:
            with sp.Writer(
                str(src / "ckpt"),
                rank=r,
                world_size=n,
                compression="none",
                merge_token=TOKEN,
                durable=False,
            ) as w:
                for j in range(args.tensors):
                    w.add(f"t{j:03d}@{r},0", np.full(4, r, dtype=np.float32))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(rank, range(n)))
        times: dict[str, list[float]] = {"heap": [], "in order": []}
        work = tmp / "work"
        for i in range(2 * args.rounds + 1):
            # round 0 only remembers the order (a heap merge, not counted)
            path = "heap" if i % 2 == 1 else "in order"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(src, work)
            if path == "heap":
                _core.forget_merge_orders()
            before = _core.merge_order_stats()
            c0 = time.process_time()
            sp.merge(str(work / "ckpt"), n, token=TOKEN, wait_cleanup=False)
            cpu = time.process_time() - c0
            sp.wait_for_cleanups()
            took_order = _core.merge_order_stats()[0] > before[0]
            assert took_order == (path == "in order" and i > 0), (i, path, took_order)
            if i > 0:
                times[path].append(cpu)
        for path, ts in times.items():
            print(
                f"N={n} tensors={args.tensors} {path:8s} merge_cpu median={statistics.median(ts):.3f}s "
                f"min={min(ts):.3f}s rounds={len(ts)}",
                flush=True,
            )
        print(f"load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
