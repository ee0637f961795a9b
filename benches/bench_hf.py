"""Hugging Face directories: ``sp.open`` beside ``safetensors.safe_open`` and ``huggingface_hub``.

Not a test: prints figures measured side by side in one run.

    .venv/bin/python benches/bench_hf.py [--scale 1.0] [--out DIR] [--repeat 3]

Fixture: two copies of ``make_model`` (``bench_storage.py``, ~1 GB fp32 each, ~440 tensors in
all), saved by ``huggingface_hub.save_torch_state_dict`` into ~10 shards (``--scale`` shrinks the
tensors). Two workloads, each from a cold page cache (the shard files are evicted with
``posix_fadvise(DONTNEED)`` before every run) and warm:

- lazy: read 1% of the tensors (a fixed random sample, spread over the shards) into memory:
  ``sp.open(dir)`` + copy each; ``safe_open`` on each tensor's shard (found through the index)
  + ``get_tensor``; ``huggingface_hub.load_torch_model`` into a module holding only those
  tensors (it reads every shard whole: the hub has no lazy path);
- full: every tensor in memory: ``sp.open(dir).load()`` + touch every page (zero-copy views);
  ``safetensors.numpy.load_file`` per shard; ``load_torch_model`` into the full module.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import huggingface_hub as hub  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file as st_load_file  # noqa: E402

import shardpoint as sp  # noqa: E402
from bench_storage import make_model  # noqa: E402


def evict(directory: str) -> None:
    """Drop the directory's files from the page cache (no root needed)."""
    from bench_load import evict as drop  # the tests' helper (tests/page_cache.py)

    drop([os.path.join(directory, name) for name in os.listdir(directory)])


def timed(fn: Callable[[], object], repeat: int, cold_dir: str | None) -> float:
    """Best-of-``repeat`` wall time; with ``cold_dir`` its files are evicted before each run."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        if cold_dir is not None:
            evict(cold_dir)
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def touch_np(arrs: dict) -> int:
    s = 0
    for a in arrs.values():
        if a.size:
            s += int(a.reshape(-1).view(np.uint8)[::4096].sum())
    return s


def module_for(shapes: dict[str, tuple[int, ...]]) -> torch.nn.Module:
    """A module whose state_dict keys are exactly ``shapes`` (nested by the dotted names)."""
    root = torch.nn.Module()
    for key, shape in shapes.items():
        *path, leaf = key.split(".")
        m = root
        for p in path:
            if not hasattr(m, p):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        m.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape), requires_grad=False))
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the fixture (1.0: ~2 GB)")
    ap.add_argument("--out", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench_hf.", dir=args.out)
    try:
        run(root, args.scale, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: str, scale: float, repeat: int) -> None:
    state: dict[str, torch.Tensor] = {}
    for part, seed in (("a", 0), ("b", 1)):
        for k, v in make_model(seed=seed, scale=scale).items():
            state[f"model.{part}.{k}"] = torch.from_numpy(v)
    total = sum(t.numel() * t.element_size() for t in state.values())
    hf = os.path.join(root, "hf")
    os.mkdir(hf)
    t0 = time.perf_counter()
    hub.save_torch_state_dict(state, hf, max_shard_size=int(total / 9.5))
    t_write = time.perf_counter() - t0
    shards = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))
    with open(os.path.join(hf, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    keys = sorted(weight_map)
    sample = sorted(random.Random(0).sample(keys, max(1, round(len(keys) / 100))))
    sample_bytes = sum(state[k].numel() * state[k].element_size() for k in sample)
    shapes = {k: tuple(state[k].shape) for k in keys}
    del state
    gc.collect()
    print(
        f"fixture: {len(keys)} tensors, {total / 1e9:.2f} GB fp32 in {len(shards)} shards "
        f"(written by huggingface_hub in {t_write:.1f} s); 1% sample: {len(sample)} tensors, "
        f"{sample_bytes / 1e6:.1f} MB in {len({weight_map[k] for k in sample})} shards"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    def sp_lazy() -> None:
        with sp.open(hf) as r:
            got = {k: np.array(r[k]) for k in sample}
        assert len(got) == len(sample)

    def st_lazy() -> None:
        got = {}
        for k in sample:
            with safe_open(os.path.join(hf, weight_map[k]), framework="numpy") as f:
                got[k] = f.get_tensor(k)
        assert len(got) == len(sample)

    small = module_for({k: shapes[k] for k in sample})

    def hub_lazy() -> None:
        hub.load_torch_model(small, hf, strict=False)

    def sp_full() -> None:
        with sp.open(hf) as r:
            touch_np(r.load())

    def st_full() -> None:
        for name in shards:
            touch_np(st_load_file(os.path.join(hf, name)))

    full = module_for(shapes)

    def hub_full() -> None:
        hub.load_torch_model(full, hf, strict=True)

    rows = [
        ("lazy 1%", "sp.open(dir) + copy", sp_lazy),
        ("lazy 1%", "safe_open per shard + get_tensor", st_lazy),
        ("lazy 1%", "huggingface_hub.load_torch_model", hub_lazy),
        ("full", "sp.open(dir).load() + touch pages", sp_full),
        ("full", "safetensors.numpy.load_file per shard", st_full),
        ("full", "huggingface_hub.load_torch_model", hub_full),
    ]
    results: dict[tuple[str, str], tuple[float, float]] = {}
    for what, name, fn in rows:
        cold = timed(fn, repeat, hf)
        warm = timed(fn, repeat, None)
        results[(what, name)] = (cold, warm)
    print("\n| workload | reader | cold (s) | warm (s) | GB/s cold |")
    print("|---|---|---:|---:|---:|")
    for (what, name), (cold, warm) in results.items():
        nbytes = sample_bytes if what == "lazy 1%" else total
        print(f"| {what} | {name} | {cold:.3f} | {warm:.3f} | {nbytes / 1e9 / cold:.2f} |")
    for what in ("lazy 1%", "full"):
        ours = results[(what, rows[0][1] if what == "lazy 1%" else rows[3][1])]
        for (w, name), (cold, warm) in results.items():
            if w == what and not name.startswith("sp."):
                print(
                    f"{what}: {name} / sp.open = {cold / ours[0]:.1f}x cold, {warm / ours[1]:.1f}x warm"
                )


if __name__ == "__main__":
    main()
