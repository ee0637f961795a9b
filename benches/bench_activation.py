"""Activation checkpointing benchmark: memory kept for backward and step time, on CPU.

A 32-block transformer-like MLP stack (pre-LayerNorm, Linear 4x up, GELU, dropout, Linear
down, residual) is trained for a few steps under each configuration:

* no checkpointing;
* torch.utils.checkpoint.checkpoint_sequential (both variants, RNG preserved);
* shardpoint.activation.checkpoint_sequential (both variants, RNG preserved or not) at
  round(sqrt(32)) = 6 segments, plus segments="auto".

Columns: "saved MiB" is what autograd holds for backward when forward ends (distinct tensor
storages seen by ``saved_tensors_hooks``, parameters excluded); "peak MiB" adds the largest
checkpointed chunk's own saved tensors, which exist while that chunk is recomputed during
backward (an estimate: measured by running that chunk without checkpointing); "step ms" is the
median forward+backward time, configurations interleaved round-robin so that machine noise hits
all of them alike. Run: ``python benches/bench_activation.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.utils.checkpoint as tuc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from shardpoint.activation import checkpoint_sequential, split_points  # noqa: E402
from shardpoint.activation import auto_segments  # noqa: E402


class Block(torch.nn.Module):
    """Pre-norm residual MLP block, the feed-forward half of a transformer layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def saved_bytes(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> int:
    """Distinct storages autograd keeps for backward at the end of ``run`` (no params)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    total = sum(seen.values())
    out.sum().backward()
    model.zero_grad(set_to_none=True)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(args.width) for _ in range(args.blocks)])
    x = torch.randn(args.tokens, args.width, requires_grad=True)
    k = round(math.sqrt(args.blocks))
    auto_k = auto_segments(args.blocks)

    def ours(segments: int | str, reentrant: bool, rng: bool) -> Callable[[], torch.Tensor]:
        return lambda: checkpoint_sequential(
            model, segments, x, use_reentrant=reentrant, preserve_rng_state=rng
        )

    def theirs(reentrant: bool) -> Callable[[], torch.Tensor]:
        return lambda: tuc.checkpoint_sequential(model, k, x, use_reentrant=reentrant)

    configs: list[tuple[str, int, Callable[[], torch.Tensor]]] = [
        ("no checkpointing", 1, lambda: model(x)),
        ("torch non-reentrant", k, theirs(False)),
        ("ours non-reentrant", k, ours(k, False, True)),
        ("ours non-reentrant rng=off", k, ours(k, False, False)),
        ("torch reentrant", k, theirs(True)),
        ("ours reentrant", k, ours(k, True, True)),
        ("ours reentrant rng=off", k, ours(k, True, False)),
        ("ours non-reentrant auto", auto_k, ours("auto", False, True)),
    ]

    # Bytes a chunk saves while it is recomputed = what it saves when run normally.
    def chunk_bytes(start: int, stop: int) -> int:
        chunk = torch.nn.Sequential(*list(model)[start:stop])
        return saved_bytes(model, lambda: chunk(x))

    rows = []
    for name, segs, run in configs:
        saved = saved_bytes(model, run)
        chunks = split_points(args.blocks, segs)[:-1]
        peak = saved + max((chunk_bytes(a, b) for a, b in chunks), default=0)
        rows.append([name, segs, saved, peak, []])

    def step(run: Callable[[], torch.Tensor]) -> float:
        model.zero_grad(set_to_none=True)
        x.grad = None
        start = time.perf_counter()
        run().square().mean().backward()
        return time.perf_counter() - start

    for run in (c[2] for c in configs):  # warm-up
        step(run)
    for _ in range(args.reps):
        for row, (_, _, run) in zip(rows, configs, strict=True):
            row[4].append(step(run))

    base_saved = rows[0][2]
    times = {row[0]: statistics.median(row[4]) for row in rows}
    print(
        f"{args.blocks} blocks, width {args.width}, {args.tokens} tokens, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.reps} steps"
    )
    header = (
        f"{'configuration':<28} {'segs':>4} {'saved MiB':>10} {'vs none':>8} "
        f"{'peak MiB':>9} {'step ms':>8} {'vs torch':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, segs, saved, peak, _ in rows:
        ref = "torch reentrant" if "reentrant" in name and "non" not in name else None
        ref = ref or ("torch non-reentrant" if name.startswith("ours") else None)
        rel = f"{times[name] / times[ref] - 1:+.1%}" if ref else ""
        print(
            f"{name:<28} {segs:>4} {saved / 2**20:>10.2f} {base_saved / saved:>7.2f}x "
            f"{peak / 2**20:>9.2f} {times[name] * 1e3:>8.1f} {rel:>9}"
        )


if __name__ == "__main__":
    main()
