"""Memory-budget planner, offload and selective policies (issue 16)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from shardpoint.activation import (  # noqa: E402
    ActivationMemoryMeter,
    BudgetTooSmallError,
    CheckpointedSequential,
    LayerProfile,
    checkpoint,
    checkpoint_sequential,
    plan,
)
from shardpoint.activation._offload import OffloadSession, remove_stale_scratch  # noqa: E402
from shardpoint.activation._planner import Checkpointed, Stored, solve  # noqa: E402

WIDTHS = (256, 64, 64, 64, 256, 256, 64, 64, 64, 64, 512, 64)


def hetero_model(seed: int = 0) -> nn.Sequential:
    """12 MLP blocks of irregular widths (heterogeneous on purpose), with dropout so RNG
    replay matters."""
    torch.manual_seed(seed)
    blocks = []
    for width in WIDTHS:
        blocks.append(
            nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Dropout(0.1), nn.Linear(width, 64))
        )
    return nn.Sequential(*blocks)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def reference(model: nn.Module, x: torch.Tensor, seed: int = 7) -> tuple[list, int]:
    model.zero_grad()
    torch.manual_seed(seed)
    with ActivationMemoryMeter() as meter:
        model(x).sum().backward()
    return grads_of(model), meter.peak


def test_budget_sweep_peak_within_budget_and_grads_bitwise_equal():
    model = hetero_model()
    x = torch.randn(128, 64)
    expected, everything = reference(model, x)
    first = plan(model, x, everything)
    minimum = first.minimum_budget
    assert 0 < minimum < everything
    budgets = [int(minimum * 1.03)] + [
        int(minimum + (everything - minimum) * f) for f in (0.1, 0.3, 0.5, 0.8, 1.0)
    ]
    extras = []
    for budget in budgets:
        p = plan(model, x, budget)
        assert p.expected_peak <= budget
        model.zero_grad()
        torch.manual_seed(7)
        with ActivationMemoryMeter() as meter:
            checkpoint_sequential(model, p, x).sum().backward()
        assert meter.peak <= budget, (budget, meter.peak, p)
        assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))
        extras.append(p.extra_seconds)
    # more memory never means more recomputation; keeping everything recomputes nothing
    assert extras[-1] == 0
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise([extras[0], extras[-1]]))


def test_budget_below_minimum_states_the_minimum():
    model = hetero_model()
    x = torch.randn(32, 64)
    with pytest.raises(BudgetTooSmallError, match=r"below the minimum .* needs: (\d+) bytes") as e:
        plan(model, x, 1000)
    assert isinstance(e.value, ValueError)
    minimum = e.value.minimum
    assert str(minimum) in str(e.value)
    p = plan(model, x, int(minimum * 1.03))  # just above it works
    assert p.expected_peak <= minimum * 1.03
    with pytest.raises(ValueError, match="positive"):
        plan(model, x, -5)
    with pytest.raises(TypeError):
        plan(model, x, "lots")


def _profiles(saved, inputs, times):
    return [
        LayerProfile(i, f"l{i}", inputs[i], saved[i], inputs[min(i + 1, len(inputs) - 1)], t)
        for i, t in enumerate(times)
    ]


def _model_peak_and_cost(pieces, saved, inputs, times):
    """Single-level schedule: list of (start, stop, checkpointed)."""
    kept, peak, cost = 0, 0, 0.0
    for start, stop, ck in pieces:
        if ck:
            peak = max(peak, kept + inputs[start] + sum(saved[start:stop]))
            kept += inputs[start]
            cost += sum(times[start:stop])
        else:
            kept += sum(saved[start:stop])
        peak = max(peak, kept)
    return peak, cost


@pytest.mark.parametrize("seed", range(6))
def test_solver_beats_every_single_level_schedule(seed):
    """Exhaustive check on random heterogeneous chains of 7 layers: the DP's plan fits the
    budget in the model and recomputes no more than the best single-level schedule."""
    import random

    rng = random.Random(seed)
    n = 7
    saved = [rng.randint(2, 40) * 1000 for _ in range(n)]
    inputs = [rng.randint(1, 10) * 1000 for _ in range(n)]
    times = [rng.uniform(0.1, 5.0) for _ in range(n)]
    profiles = _profiles(saved, inputs, times)
    budget = int(sum(saved) * rng.uniform(0.35, 0.8))
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        pieces_list = list(itertools.pairwise(bounds))
        for flags in itertools.product([False, True], repeat=len(pieces_list)):
            pieces = [(a, b, f) for (a, b), f in zip(pieces_list, flags, strict=True)]
            peak, cost = _model_peak_and_cost(pieces, saved, inputs, times)
            if peak <= budget:
                best = min(best, cost)
    try:
        p = solve(profiles, budget, slots=2000, prefer_even_split=False)
    except BudgetTooSmallError:
        assert best == float("inf")
        return
    assert p.expected_peak <= budget
    assert p.extra_seconds <= best + 1e-9


def test_plan_table_lists_layers_kept_peak_and_extra():
    model = hetero_model()
    x = torch.randn(64, 64)
    _, everything = reference(model, x)
    p = plan(model, x, everything // 2)
    table = str(p)
    assert "kept until backward" in table and "peak while here" in table and "extra" in table
    assert "input only" in table and "all saved tensors" in table
    assert "expected peak" in table.splitlines()[0]
    covered = [i for start, stop, _ in p.segments for i in range(start, stop)]
    assert covered == list(range(len(WIDTHS)))
    assert any(isinstance(n, Checkpointed) for n in p.nodes)
    assert any(isinstance(n, Stored) for n in p.nodes)


def test_checkpoint_sequential_budget_and_module_wrapper():
    model = hetero_model()
    x = torch.randn(64, 64)
    expected, everything = reference(model, x)
    with pytest.raises(ValueError, match="needs memory_budget"):
        checkpoint_sequential(model, "budget", x)
    with pytest.raises(ValueError, match="only used with segments='budget'"):
        checkpoint_sequential(model, 3, x, memory_budget=10)
    model.zero_grad()
    torch.manual_seed(7)
    checkpoint_sequential(model, "budget", x, memory_budget=everything // 2).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))

    wrapped = CheckpointedSequential(model, memory_budget=everything // 2)
    model.zero_grad()
    torch.manual_seed(7)
    with ActivationMemoryMeter() as meter:
        wrapped(x).sum().backward()
    assert meter.peak <= everything // 2
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))
    assert wrapped.last_plan is not None and wrapped.last_plan.extra_seconds > 0
    wrapped.eval()
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    with pytest.raises(TypeError, match="nn.Sequential"):
        CheckpointedSequential(nn.Linear(2, 2), memory_budget=10)


def test_planner_never_worse_than_sqrt_segments_on_heterogeneous_chain():
    """At the measured peak of sqrt(n) segments, the planner's plan fits and, in the model
    (same measured profile for both), never recomputes more than sqrt(n) segments (it falls
    back to the even split unless its own plan is modelled clearly cheaper)."""
    model = hetero_model()
    x = torch.randn(128, 64)
    torch.manual_seed(7)
    with ActivationMemoryMeter() as meter:
        checkpoint_sequential(model, 4, x).sum().backward()
    p = plan(model, x, meter.peak)
    sqrt_extra = sum(q.forward_seconds for q in p.profiles[:9])  # 3 checkpointed chunks of 3
    assert p.extra_seconds <= sqrt_extra + 1e-12
    model.zero_grad()
    with ActivationMemoryMeter() as planned:
        checkpoint_sequential(model, p, x).sum().backward()
    assert planned.peak <= meter.peak


# --- offload ---------------------------------------------------------------------------------


def test_offload_disk_bitwise_grads_and_scratch_lifecycle(tmp_path):
    model = hetero_model()
    x = torch.randn(256, 64)
    expected, _ = reference(model, x)
    model.zero_grad()
    torch.manual_seed(7)
    out = checkpoint_sequential(model, 4, x, offload="disk", offload_dir=tmp_path)
    dirs = [d for d in os.listdir(tmp_path) if d.startswith("shardpoint-offload-")]
    assert len(dirs) == 1  # scratch directory exists between forward and backward
    out.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))
    del out
    import gc

    gc.collect()
    assert os.listdir(tmp_path) == []  # removed after use

    # an exception in forward removes it too
    def boom(t):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        checkpoint_sequential([*model, boom], 4, x, offload="disk", offload_dir=tmp_path)
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_offload_disk_with_planner_and_files_written(tmp_path):
    model = hetero_model()
    x = torch.randn(256, 64)
    expected, everything = reference(model, x)
    p = plan(model, x, everything // 3, offload="disk")
    assert p.offload == "disk" and "offload=disk" in str(p)
    model.zero_grad()
    torch.manual_seed(7)
    out = checkpoint_sequential(model, p, x, offload="disk", offload_dir=tmp_path)
    (scratch,) = os.listdir(tmp_path)
    import time

    deadline = time.monotonic() + 10
    while not os.listdir(tmp_path / scratch) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any(name.endswith(".index") for name in os.listdir(tmp_path / scratch))
    out.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))


def test_crash_leftovers_removed_at_next_run(tmp_path):
    # A scratch dir of a process that no longer runs (a child that exited).
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = tmp_path / f"shardpoint-offload-{child.stdout.strip()}-abc"
    dead.mkdir()
    (dead / "t0.index").write_bytes(b"x")
    mine = tmp_path / f"shardpoint-offload-{os.getpid()}-live"
    mine.mkdir()
    session = OffloadSession("disk", directory=tmp_path)
    assert not dead.exists() and mine.exists()
    session.close()
    assert remove_stale_scratch(str(tmp_path)) == []


def test_offload_disk_lowers_peak_rss(tmp_path):
    """End to end in fresh processes: peak resident memory with offload='disk' is lower than
    with the same checkpoints kept in memory."""
    script = textwrap.dedent(
        """
        import sys, torch
        from torch import nn
        from shardpoint.activation import checkpoint_sequential
        def status(field):
            with open("/proc/self/status") as f:
                return int(next(l for l in f if l.startswith(field)).split()[1])
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(16)])
        x = torch.randn(16384, 256)  # 16 MiB per boundary activation
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark: imports may have peaked higher
        base = status("VmRSS:")
        off = sys.argv[1] if sys.argv[1] != "none" else None
        out = checkpoint_sequential(model, 16, x, offload=off, offload_dir=sys.argv[2])
        out.sum().backward()
        print(status("VmHWM:") - base)
        """
    )
    peaks = {}
    # glibc's dynamic mmap threshold would serve freed 16 MiB blocks from the heap, which never
    # shrinks: resident memory would then show the allocator's high-water mark, not our data.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    for mode in ("none", "disk"):
        run = subprocess.run(
            [sys.executable, "-c", script, mode, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        peaks[mode] = int(run.stdout.strip().splitlines()[-1])
    # 15 boundaries of 16 MiB stay in memory without offload; with it, about two at a time.
    assert peaks["disk"] < peaks["none"] - 100 * 1024, peaks


def test_offload_cpu_on_cpu_tensors_keeps_them_and_grads_equal():
    model = hetero_model()
    x = torch.randn(64, 64)
    expected, _ = reference(model, x)
    model.zero_grad()
    torch.manual_seed(7)
    checkpoint_sequential(model, 4, x, offload="cpu").sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))
    with pytest.raises(ValueError, match="offload must be one of"):
        checkpoint_sequential(model, 4, x, offload="tape")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_offload_from_gpu_bitwise_grads(kind, tmp_path):
    model = hetero_model().cuda()
    x = torch.randn(256, 64, device="cuda")
    expected, _ = reference(model, x)
    model.zero_grad()
    torch.manual_seed(7)
    before = torch.cuda.memory_allocated()
    out = checkpoint_sequential(model, 4, x, offload=kind, offload_dir=tmp_path)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before >= 0
    out.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))


# --- selective policies ------------------------------------------------------------------------


class _CountMM(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.mm += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("policy", ["matmul", [torch.ops.aten.mm, torch.ops.aten.addmm]])
def test_policy_saves_matmuls_and_recomputes_pointwise(policy):
    lin1, lin2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def fn(t):
        return lin2(torch.nn.functional.gelu(lin1(t))).tanh()

    x = torch.randn(8, 16, requires_grad=True)
    (expected,) = torch.autograd.grad(fn(x).sum(), x)
    counts = {}
    for name, kwargs in (("plain", {}), ("policy", {"policy": policy})):
        out = checkpoint(fn, x, **kwargs).sum()
        with _CountMM() as counter:
            (got,) = torch.autograd.grad(out, x)
        assert torch.allclose(got, expected)
        counts[name] = counter.mm
    # plain recomputes both addmm in backward; with the policy they come from the cache
    assert counts["policy"] == counts["plain"] - 2


def test_policy_errors():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="either policy= or context_fn="):
        checkpoint(torch.sin, x, policy="matmul", context_fn=lambda: (None, None))
    with pytest.raises(ValueError, match="use_reentrant=False"):
        checkpoint(torch.sin, x, policy="matmul", use_reentrant=True)
    with pytest.raises(ValueError, match="policy must be"):
        checkpoint(torch.sin, x, policy="everything")
    with pytest.raises(ValueError, match="expected torch ops"):
        checkpoint(torch.sin, x, policy=["mm"])
