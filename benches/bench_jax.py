"""JAX pytrees: ``shardpoint.jax`` beside Orbax's ``StandardCheckpointer``, in one run.

Not a test: prints figures measured side by side.

    .venv/bin/python benches/bench_jax.py [--scale 1.0] [--out DIR] [--repeat 2]

Tree: ``make_model`` of ``bench_storage.py`` (~1 GB fp32, ~220 tensors, trained-weight-like
values) nested as ``params/<a>/<b>/...`` jax arrays, plus a step counter. Save times include
everything up to a committed checkpoint on disk (shardpoint fsyncs, its default; Orbax:
``save`` + ``wait_until_finished``); restore is into an abstract target
(``jax.ShapeDtypeStruct`` leaves), result blocked until ready. Best of ``--repeat`` rounds; each
round runs every writer once, interleaved, each save into a fresh directory.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import orbax.checkpoint as ocp  # noqa: E402

import shardpoint.jax as spj  # noqa: E402
from bench_storage import make_model  # noqa: E402


def nest(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for k, v in flat.items():
        *path, leaf = k.split(".")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = jax.numpy.asarray(v)
    return tree


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    n = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            n += os.path.getsize(os.path.join(d, f))
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the tree (1.0: ~1 GB)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench_jax.", dir=args.out)
    try:
        run(root, args.scale, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: str, scale: float, repeat: int) -> None:
    tree = {"params": nest(make_model(scale=scale)), "step": 1000}
    leaves = jax.tree_util.tree_leaves(tree)
    raw = sum(x.nbytes for x in leaves if hasattr(x, "nbytes"))
    abstract = jax.tree_util.tree_map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array)
            else x
        ),
        tree,
    )
    print(
        f"tree: {len(leaves)} leaves, {raw / 1e9:.2f} GB; jax {jax.__version__}, {jax.devices()[0].platform}"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    ckptr = ocp.StandardCheckpointer()

    def sp_save(kw: dict) -> Callable[[str], None]:
        return lambda d: spj.save(tree, f"{d}/ckpt", **kw)

    def sp_restore(d: str) -> None:
        jax.block_until_ready(spj.restore(f"{d}/ckpt", target=abstract))

    def o_save(d: str) -> None:
        ckptr.save(f"{d}/orbax", tree)
        ckptr.wait_until_finished()

    def o_restore(d: str) -> None:
        jax.block_until_ready(ckptr.restore(f"{d}/orbax", abstract))

    cases: list[tuple[str, Callable[[str], None], Callable[[str], None]]] = [
        ("shardpoint.jax zstd", sp_save({}), sp_restore),
        ("shardpoint.jax none", sp_save({"compression": "none"}), sp_restore),
        ("orbax StandardCheckpointer", o_save, o_restore),
    ]
    # Rounds interleave the writers, so a change in the (shared) machine's load hits all alike.
    times = {name: [float("inf"), float("inf")] for name, _, _ in cases}
    sizes: dict[str, int] = {}
    for rnd in range(repeat):
        for i, (name, save, restore) in enumerate(cases):
            d = f"{root}/c{i}r{rnd}"
            os.makedirs(d)
            gc.collect()
            os.sync()
            t0 = time.perf_counter()
            save(d)
            times[name][0] = min(times[name][0], time.perf_counter() - t0)
            sizes[name] = du(d)
            gc.collect()
            t0 = time.perf_counter()
            restore(d)
            times[name][1] = min(times[name][1], time.perf_counter() - t0)
            shutil.rmtree(d)
    ckptr.close()
    results = [(name, ts, tr, sizes[name]) for name, (ts, tr) in times.items()]

    print("\n| writer | save (s) | save GB/s | restore (s) | restore GB/s | on disk (MB) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ts, tr, size in results:
        print(
            f"| {name} | {ts:.2f} | {raw / 1e9 / ts:.2f} | {tr:.2f} | {raw / 1e9 / tr:.2f} "
            f"| {size / 1e6:.0f} | {raw / size:.3f} |"
        )
    o = results[-1]
    for name, ts, tr, size in results[:-1]:
        print(
            f"{name}: save {o[1] / ts:.2f}x, restore {o[2] / tr:.2f}x Orbax's speed; "
            f"{size / o[3]:.2f}x its bytes"
        )


if __name__ == "__main__":
    main()
