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
all of them alike. Run: ``python benches/bench_activation.py`` (about a minute on 2 cores; --help for sizes).
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
from shardpoint.activation import (  # noqa: E402
    auto_segments,  # noqa: E402
    checkpoint_sequential,
    split_points,
)


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
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: least sensitive to load)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

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
    for round_no in range(args.reps):
        # Alternate the order every round so that no configuration always runs after the
        # same neighbour (allocator and cache state, load bursts).
        order = list(zip(rows, configs, strict=True))
        for row, (_, _, run) in order if round_no % 2 == 0 else reversed(order):
            row[4].append(step(run))

    base_saved = rows[0][2]
    times = {row[0]: row[4] for row in rows}
    print(
        f"{args.blocks} blocks, width {args.width}, {args.tokens} tokens, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.reps} rounds"
    )
    header = (
        f"{'configuration':<28} {'segs':>4} {'saved MiB':>10} {'vs none':>8} "
        f"{'peak MiB':>9} {'min ms':>7} {'median ms':>10} {'vs torch':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, segs, saved, peak, samples in rows:
        ref = None
        if name.startswith("ours"):
            ref = "torch non-reentrant" if "non-reentrant" in name else "torch reentrant"
        # Ratio within each round (the two ran back to back), then the median over rounds:
        # robust to load changes on a shared machine.
        rel = ""
        if ref is not None:
            ratios = [a / b for a, b in zip(samples, times[ref], strict=True)]
            rel = f"{statistics.median(ratios) - 1:+.1%}"
        print(
            f"{name:<28} {segs:>4} {saved / 2**20:>10.2f} {base_saved / saved:>7.2f}x "
            f"{peak / 2**20:>9.2f} {min(samples) * 1e3:>7.1f} "
            f"{statistics.median(samples) * 1e3:>10.1f} {rel:>9}"
        )
    print(
        "vs torch: median over rounds of (ours / torch.utils.checkpoint) step time, same variant;"
        " the auto row is compared with torch at sqrt(n) segments."
    )


if __name__ == "__main__":
    main()
