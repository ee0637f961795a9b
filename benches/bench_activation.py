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
import functools
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
    ActivationMemoryMeter,
    auto_segments,
    checkpoint_sequential,
    plan,
    split_points,
)
from shardpoint.activation._nonreentrant import RecomputeTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from activation_models import Block, gpt_like, uniform_mlp  # noqa: E402


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
    parser.add_argument(
        "--part",
        choices=["all", "parity", "planner", "recompute", "sweep", "offload"],
        default="all",
        help="parity: ours vs torch at equal segments; planner: planner vs sqrt(n) at equal "
        "budget; recompute: A/B of the time spent recomputing (planner, unguarded DP, sqrt(n), "
        "A/A control), many interleaved rounds; sweep: budget sweep (table + PNG); offload: "
        "offload='disk' peak RSS",
    )
    parser.add_argument(
        "--rounds", type=int, default=40, help="interleaved rounds of the recompute A/B"
    )
    parser.add_argument("--png", default="bench_activation_sweep.png", help="sweep plot path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part in ("all", "parity"):
        parity(args)
    if args.part in ("all", "planner"):
        planner_vs_sqrt(args)
    if args.part in ("all", "recompute"):
        recompute_ab(args)
    if args.part in ("all", "sweep"):
        budget_sweep(args)
    if args.part in ("all", "offload"):
        offload_rss(args)


def parity(args: argparse.Namespace) -> None:
    """Ours vs torch.utils.checkpoint at equal segment counts (both variants)."""

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


# --- issue 16: planner, budget sweep, offload ----------------------------------------------


def _step(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    run().float().sum().backward()  # sum saves nothing: the meter sees the chain only
    return time.perf_counter() - start


def _peak(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> int:
    model.zero_grad(set_to_none=True)
    with ActivationMemoryMeter() as meter:
        run().float().sum().backward()
    return meter.peak


def _time_configs(
    model: torch.nn.Module,
    configs: dict[str, Callable[[], torch.Tensor]],
    reps: int,
    recompute: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Step times per configuration, interleaved rounds; ``recompute`` (if given) receives the
    time our checkpoints spent recomputing in each step."""
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for run in configs.values():
        _step(model, run)  # warm-up
    names = list(configs)
    for round_no in range(reps):
        # Rotate the order each round (every configuration runs in every position, after
        # every neighbour), alternating direction: load bursts and allocator state hit all alike.
        shift = round_no % len(names)
        order = names[shift:] + names[:shift]
        for name in order if round_no % 2 == 0 else reversed(order):
            with RecomputeTimer() as timer:
                samples[name].append(_step(model, configs[name]))
            if recompute is not None:
                recompute.setdefault(name, []).append(timer.seconds)
    return samples


def _planner_configs(
    model: torch.nn.Module, x: torch.Tensor, k: int
) -> dict[str, Callable[[], torch.Tensor]]:
    return {
        "no checkpointing": functools.partial(model, x),
        f"torch checkpoint_sequential({k})": functools.partial(
            tuc.checkpoint_sequential, model, k, x, use_reentrant=False
        ),
        f"ours checkpoint_sequential({k})": functools.partial(checkpoint_sequential, model, k, x),
    }


def planner_vs_sqrt(args: argparse.Namespace) -> None:
    """At a budget equal to the measured peak of sqrt(n) segments: planner vs sqrt(n) segments
    (ours and torch.utils.checkpoint). Recompute time = step time - step time without
    checkpointing, medians over interleaved rounds."""
    print()
    print("planner vs sqrt(n) segments at equal budget (budget = measured peak of ours at sqrt(n))")
    cases = [
        ("gpt-like (heterogeneous)", gpt_like(), torch.randint(0, 512, (4, 128))),
        (
            f"{args.blocks}-block MLP (uniform)",
            uniform_mlp(args.blocks, args.width),
            torch.randn(args.tokens, args.width),
        ),
    ]
    header = (
        f"{'model / configuration':<44} {'peak MiB':>9} {'step ms':>8} {'step-none ms':>13} "
        f"{'vs sqrt ours':>13} {'vs sqrt torch':>14} {'in recompute ms':>16}"
    )
    for title, model, x in cases:
        n = len(model)
        k = round(math.sqrt(n))
        configs = _planner_configs(model, x, k)
        budget = _peak(model, configs[f"ours checkpoint_sequential({k})"])
        p = plan(model, x, budget)
        configs["ours planner"] = functools.partial(checkpoint_sequential, model, p, x)
        inside: dict[str, list[float]] = {}
        samples = _time_configs(model, configs, args.reps, inside)
        # Recompute time per round (config minus no checkpointing in the same round), median.
        none = samples["no checkpointing"]
        recompute = {
            name: statistics.median(a - b for a, b in zip(v, none, strict=True))
            for name, v in samples.items()
        }
        timed = {name: statistics.median(v) for name, v in inside.items()}
        print(f"\n{title}: {n} functions, sqrt(n) = {k} segments, budget {budget / 2**20:.2f} MiB")
        print(p)
        print(header)
        print("-" * len(header))
        for name in configs:
            peak = _peak(model, configs[name]) if name.startswith(("ours", "no")) else None
            rc = recompute[name]
            rel_ours = rc / recompute[f"ours checkpoint_sequential({k})"] - 1
            rel_torch = rc / recompute[f"torch checkpoint_sequential({k})"] - 1
            print(
                f"{title[:14] + ' / ' + name:<44} "
                f"{(f'{peak / 2**20:.2f}' if peak is not None else 'n/a'):>9} "
                f"{statistics.median(samples[name]) * 1e3:>8.1f} {rc * 1e3:>13.1f} "
                f"{rel_ours:>+13.1%} {rel_torch:>+14.1%} "
                f"{(f'{timed[name] * 1e3:.1f}' if name.startswith('ours') else 'n/a'):>16}"
            )
        sq = timed[f"ours checkpoint_sequential({k})"]
        print(
            f"measured time inside recomputes: planner {timed['ours planner'] * 1e3:.1f} ms vs "
            f"sqrt(n) {sq * 1e3:.1f} ms ({timed['ours planner'] / sq - 1:+.1%})"
        )
        sqrt_model = sum(q.forward_seconds for q in p.profiles[: (k - 1) * (n // k)])
        print(
            f"model: planner recomputes {p.extra_seconds * 1e3:.1f} ms, sqrt(n) segments "
            f"{sqrt_model * 1e3:.1f} ms ({p.extra_seconds / sqrt_model - 1:+.1%})"
        )
    print(
        "(torch's peak is n/a: its recomputed tensors are invisible to our meter; its schedule "
        "is the same as ours at sqrt(n))"
    )


def _median_ci(values: list[float]) -> tuple[float, float, float]:
    """Median and a distribution-free 95% confidence interval of it (order statistics at
    n/2 -+ 1.96 sqrt(n)/2, the normal approximation of the binomial)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return statistics.median(ordered), ordered[lo], ordered[hi]


def recompute_ab(args: argparse.Namespace) -> None:
    """The time spent inside recomputes (RecomputeTimer: wall time of the outermost recomputes
    of one backward), measured directly rather than as step-time differences: at the budget
    of sqrt(n) segments, the shipped planner, the solver's own optimum without the even-split
    fallback ("DP unguarded") and sqrt(n) segments twice (A/A: the noise floor), interleaved
    for ``--rounds`` rounds in a rotating order. Per configuration: median ms, and the
    per-round ratio to sqrt(n) (two steps of the same round): its median with a 95% confidence
    interval, and its quartiles.
    "model" is the planner's modelled recompute for that schedule (profiled forward times plus
    the fixed cost per checkpoint)."""
    print()
    print(
        f"recompute time A/B at the budget of sqrt(n) segments, {args.rounds} interleaved "
        "rounds (RecomputeTimer)"
    )
    cases = [
        ("gpt-like 4x128 tokens", gpt_like(), torch.randint(0, 512, (4, 128))),
        ("gpt-like 1x512 tokens", gpt_like(), torch.randint(0, 512, (1, 512))),
        (
            f"{args.blocks}-block MLP (uniform)",
            uniform_mlp(args.blocks, args.width),
            torch.randn(args.tokens, args.width),
        ),
    ]
    from shardpoint.activation import checkpoint_overhead
    from shardpoint.activation._planner import _cost, solve

    header = (
        f"{'configuration':<24} {'segments (start, stop, ckpt)':<52} {'model ms':>9} "
        f"{'median ms':>10} {'vs sqrt(n): median':>19} {'95% CI':>16} {'IQR':>16}"
    )
    for title, model, x in cases:
        n = len(model)
        k = round(math.sqrt(n))
        sqrt_run = functools.partial(checkpoint_sequential, model, k, x)
        budget = _peak(model, sqrt_run)
        shipped = plan(model, x, budget)
        unguarded = solve(
            shipped.profiles,
            budget,
            overhead_seconds=checkpoint_overhead(),
            prefer_even_split=False,
        )
        overhead = checkpoint_overhead()
        sqrt_model = (
            sum(q.forward_seconds for q in shipped.profiles[: (k - 1) * (n // k)])
            + (k - 1) * overhead
        )
        configs: dict[str, tuple[Callable[[], torch.Tensor], float, str]] = {
            f"sqrt(n) = {k} segments": (sqrt_run, sqrt_model, f"{k} even"),
            "sqrt(n) again (A/A)": (
                functools.partial(checkpoint_sequential, model, k, x),
                sqrt_model,
                f"{k} even",
            ),
            "planner (shipped)": (
                functools.partial(checkpoint_sequential, model, shipped, x),
                _cost(shipped.nodes, shipped.profiles, overhead),
                _segments_text(shipped.segments),
            ),
            "DP unguarded": (
                functools.partial(checkpoint_sequential, model, unguarded, x),
                _cost(unguarded.nodes, unguarded.profiles, overhead),
                _segments_text(unguarded.segments),
            ),
        }
        inside: dict[str, list[float]] = {}
        _time_configs(model, {c: v[0] for c, v in configs.items()}, args.rounds, inside)
        base = inside[f"sqrt(n) = {k} segments"]
        print(
            f"\n{title}: {n} functions, budget {budget / 2**20:.2f} MiB; modelled headroom "
            f"(solver optimum vs sqrt(n)): "
            f"{_cost(unguarded.nodes, unguarded.profiles, overhead) / sqrt_model - 1:+.1%}"
        )
        print(header)
        print("-" * len(header))
        for name, (_, modelled, segs) in configs.items():
            ratios = [a / b for a, b in zip(inside[name], base, strict=True)]
            med, lo, hi = _median_ci(ratios)
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            print(
                f"{name:<24} {segs[:52]:<52} {modelled * 1e3:>9.1f} "
                f"{statistics.median(inside[name]) * 1e3:>10.1f} {med - 1:>+19.1%} "
                f"{f'{lo - 1:+.1%}..{hi - 1:+.1%}':>16} {f'{q1 - 1:+.1%}..{q3 - 1:+.1%}':>16}"
            )


def _segments_text(segments: list[tuple[int, int, bool]]) -> str:
    return " ".join(f"[{a},{b}){'c' if c else 's'}" for a, b, c in segments)


def budget_sweep(args: argparse.Namespace) -> None:
    """From the minimum budget to keep-everything: planned and measured peak, step time."""
    print()
    model = gpt_like()
    x = torch.randint(0, 512, (4, 128))
    everything = _peak(model, lambda: model(x))
    first = plan(model, x, everything)
    minimum = first.minimum_budget
    budgets = [int(minimum * 1.02)] + [
        int(minimum + (everything - minimum) * f) for f in (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
    ]
    print(
        f"budget sweep, gpt-like: minimum {minimum / 2**20:.2f} MiB, keep-everything "
        f"{everything / 2**20:.2f} MiB"
    )
    header = (
        f"{'budget MiB':>10} {'expected MiB':>13} {'measured MiB':>13} {'within':>7} "
        f"{'extra ms (model)':>17} {'step ms':>8}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    plans = [plan(model, x, b) for b in budgets]
    configs = {
        str(b): (lambda p=p: checkpoint_sequential(model, p, x))
        for b, p in zip(budgets, plans, strict=True)
    }
    samples = _time_configs(model, configs, max(5, args.reps // 2))
    for b, p in zip(budgets, plans, strict=True):
        measured = _peak(model, configs[str(b)])
        step = statistics.median(samples[str(b)])
        rows.append((b, p.expected_peak, measured, step, p.extra_seconds))
        print(
            f"{b / 2**20:>10.2f} {p.expected_peak / 2**20:>13.2f} {measured / 2**20:>13.2f} "
            f"{'yes' if measured <= b else 'NO':>7} {p.extra_seconds * 1e3:>17.1f} "
            f"{step * 1e3:>8.1f}"
        )
    print(f"measured peak within budget: {sum(r[2] <= r[0] for r in rows)}/{len(rows)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in requirements-bench.txt
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([r[0] / 2**20 for r in rows], [r[3] * 1e3 for r in rows], "o-", label="step time")
    ax.set_xlabel("memory budget (MiB of saved activations)")
    ax.set_ylabel("step time (ms)")
    ax2 = ax.twinx()
    ax2.plot(
        [r[0] / 2**20 for r in rows],
        [r[2] / 2**20 for r in rows],
        "s--",
        color="C1",
        label="measured peak",
    )
    ax2.plot(
        [r[0] / 2**20 for r in rows],
        [r[0] / 2**20 for r in rows],
        ":",
        color="grey",
        label="budget",
    )
    ax2.set_ylabel("peak saved activations (MiB)")
    fig.legend(loc="upper right", bbox_to_anchor=(0.86, 0.86), fontsize="small")
    ax.set_title("shardpoint.activation planner: gpt-like model, CPU")
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"plot: {args.png}")


_OFFLOAD_SCRIPT = """
import statistics, sys, time, torch
from torch import nn
sys.path.insert(0, sys.argv[3])
from shardpoint.activation import checkpoint_sequential, plan
def status(field):
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith(field)).split()[1])
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(16)])
x = torch.randn(16384, 256)
mode = sys.argv[1]
def run():
    if mode == "none":
        return model(x)
    if mode == "sqrt":
        return checkpoint_sequential(model, 4, x)
    compression = "zstd" if mode == "diskz" else "auto"
    return checkpoint_sequential(
        model, 16, x, offload="disk", offload_dir=sys.argv[2], offload_compression=compression
    )
run().sum().backward()  # warm-up
times = []
for _ in range(3):
    model.zero_grad()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS:")
    start = time.perf_counter()
    run().sum().backward()
    times.append(time.perf_counter() - start)
    peak = status("VmHWM:") - base
print(peak, statistics.median(times))
"""


def offload_rss(args: argparse.Namespace) -> None:
    """offload='disk' (16 one-layer checkpoints, boundaries spilled) vs no checkpointing and
    vs sqrt(n) recompute, each in a fresh process: peak resident memory above the process's
    baseline during one step, and step time."""
    import os
    import subprocess
    import tempfile

    print()
    print("offload='disk': 16 x (Linear 256 + Tanh), 16384 x 256 activations (16 MiB each), CPU")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    python_dir = str(Path(__file__).resolve().parents[1] / "python")
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in ("none", "sqrt", "disk", "diskz"):
            out = subprocess.run(
                [sys.executable, "-c", _OFFLOAD_SCRIPT, mode, scratch, python_dir],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            kib, seconds = out.stdout.split()
            results[mode] = (int(kib) / 1024, float(seconds))
    labels = {
        "none": "no checkpointing",
        "sqrt": "sqrt(n)=4 segments, recompute",
        "disk": "16 segments, offload='disk' (auto)",
        "diskz": "  same, offload_compression='zstd'",
    }
    print(f"{'configuration':<34} {'peak RSS MiB':>13} {'step ms':>8}")
    for mode, (mib, sec) in results.items():
        print(f"{labels[mode]:<34} {mib:>13.0f} {sec * 1e3:>8.0f}")
    print(
        "(MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave the resident set; peak RSS is "
        "measured with /proc/self/clear_refs + VmHWM around one step)"
    )


if __name__ == "__main__":
    main()
