"""Open time against key count (issue 25: "make open independent of key count").

For 1k, 10k, 100k and 1M one-element tensors, saved once (uncompressed), this measures in one
run, page cache warm, median of many repetitions:

- ``open``: ``_core.CheckpointReader(p)`` (the core, without the Python wrapper) and
  ``sp.open(p)`` (what users call; adds the io-mode choice and the Python object);
- ``open + hit``: open, then one lookup of a present key (O(log n) blocks read);
- ``open + miss``: open, then one lookup of an absent key (the first miss proves the whole table
  sorted, reading the entry table and key blob once);
- the anchor: ``safetensors.safe_open`` of the same tensors (its JSON header is parsed whole).

Each repetition drops the previous reader before timing the next open, so the teardown of a
reader is not charged to the next open. Prints a table and the ratios 1M / 1k.

    python benches/bench_open.py [--max-keys 1000000] [--work DIR]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

import shardpoint as sp
from shardpoint import _core


def median_us(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of ``fn()`` in microseconds (garbage collected between calls)."""
    xs = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e6


def make(work: str, n: int) -> tuple[str, str]:
    """The shardpoint prefix and safetensors file holding ``n`` one-element tensors."""
    p = os.path.join(work, f"k{n}")
    st = os.path.join(work, f"k{n}.safetensors")
    if not os.path.exists(p + ".index"):
        one = np.zeros(1, np.float32)
        data = {f"model.layers.{i:07d}.weight": one for i in range(n)}
        t0 = time.perf_counter()
        sp.save_file(data, p, compression="none", durable=False)
        print(f"  saved {n} keys in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            import safetensors.numpy as stn

            stn.save_file(data, st)
        except ImportError:
            pass
    return p, st


def measure(p: str, st: str, n: int) -> dict[str, float]:
    """The figures of one key count (see the module docstring)."""
    hit = "model.layers.0000500.weight"
    reps = 200 if n < 1_000_000 else 40
    r: dict[str, float] = {"index KiB": os.path.getsize(p + ".index") / 1024}
    r["core open"] = median_us(lambda: _core.CheckpointReader(p), reps)
    r["sp.open"] = median_us(lambda: sp.open(p).close(), reps)
    r["open + hit"] = median_us(lambda: _core.CheckpointReader(p).info(hit), reps)
    r["open + miss"] = median_us(lambda: "absent.key" in _core.CheckpointReader(p), reps)
    if os.path.exists(st):
        from safetensors import safe_open

        def st_open() -> None:
            with safe_open(st, "np") as f:
                f.keys()

        r["safetensors open"] = median_us(st_open, max(5, reps // 10))
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-keys", type=int, default=1_000_000)
    ap.add_argument("--work", default=None, help="keep the files here (reused when present)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="sp-bench-open-")
    os.makedirs(work, exist_ok=True)
    counts = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.max_keys]
    rows: dict[int, dict[str, float]] = {}
    for n in counts:
        p, st = make(work, n)
        r = measure(p, st, n)
        rows[n] = r
        print(f"  {n} keys: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)
    cols = list(next(iter(rows.values())))
    print("\nmedian µs (index size in KiB)")
    print(f"{'keys':>9} " + " ".join(f"{c:>17}" for c in cols))
    for n, r in rows.items():
        print(f"{n:>9} " + " ".join(f"{r.get(c, float('nan')):>17.1f}" for c in cols))
    lo, hi = counts[0], counts[-1]
    print(f"\nratios {hi} keys / {lo} keys:")
    for c in cols[1:]:
        if c in rows[hi] and c in rows[lo]:
            print(f"  {c}: {rows[hi][c] / rows[lo][c]:.2f}x")


if __name__ == "__main__":
    main()
