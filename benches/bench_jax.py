"""JAX pytrees: ``shardpoint.jax`` beside Orbax's ``StandardCheckpointer``, in one run.

Not a test: prints figures measured side by side.

    .venv/bin/python benches/bench_jax.py [--scale 1.0] [--out DIR] [--repeat 2]

Tree: ``make_model`` of ``bench_storage.py`` (~1 GB fp32, ~220 tensors, trained-weight-like
values) nested as ``params/<a>/<b>/...`` jax arrays, plus a step counter. Save times include
everything up to a committed checkpoint on disk (Orbax: ``save`` + ``wait_until_finished``);
restore is into an abstract target (``jax.ShapeDtypeStruct`` leaves), result blocked until
ready. Best of ``--repeat`` runs; each save goes to a fresh directory.
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


def best(fn: Callable[[int], object], repeat: int) -> float:
    t = float("inf")
    for i in range(repeat):
        gc.collect()
        os.sync()
        t0 = time.perf_counter()
        fn(i)
        t = min(t, time.perf_counter() - t0)
    return t


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

    results = []

    def sp_case(name: str, **kw: object) -> None:
        def save(i: int) -> None:
            spj.save(tree, f"{root}/{name}{i}/ckpt", **kw)

        for i in range(repeat):
            os.makedirs(f"{root}/{name}{i}", exist_ok=True)
        t_save = best(save, repeat)
        size = du(f"{root}/{name}0")

        def restore(i: int) -> None:
            out = spj.restore(f"{root}/{name}0/ckpt", target=abstract)
            jax.block_until_ready(out)

        t_restore = best(restore, repeat)
        results.append((f"shardpoint.jax {name}", t_save, t_restore, size))

    sp_case("zstd")
    sp_case("none", compression="none")
    sp_case("zstd-nofsync", durable=False)

    ckptr = ocp.StandardCheckpointer()

    def o_save(i: int) -> None:
        ckptr.save(f"{root}/orbax{i}", tree)
        ckptr.wait_until_finished()

    t_save = best(o_save, repeat)
    size = du(f"{root}/orbax0")

    def o_restore(i: int) -> None:
        out = ckptr.restore(f"{root}/orbax0", abstract)
        jax.block_until_ready(out)

    t_restore = best(o_restore, repeat)
    results.append(("orbax StandardCheckpointer", t_save, t_restore, size))
    ckptr.close()

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
