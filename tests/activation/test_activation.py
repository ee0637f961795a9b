"""shardpoint.activation: gradients, RNG handling, checkpoint_sequential, "auto", memory.

Catalog behaviours (CK-xx / SEQ-xx: PyTorch activation-checkpointing behaviours) are in
test_activation_catalog.py; this file holds the issue's cross-cutting requirements.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import torch.utils.checkpoint as tuc  # noqa: E402

from shardpoint.activation import (  # noqa: E402
    auto_segments,
    checkpoint,
    checkpoint_sequential,
    segment_cost,
    split_points,
)
from shardpoint.errors import CheckpointError  # noqa: E402

VARIANTS = [pytest.param(False, id="nonreentrant"), pytest.param(True, id="reentrant")]
REPO = Path(__file__).resolve().parents[2]


def make_mlp(depth: int = 6, width: int = 16, p: float = 0.3) -> torch.nn.Sequential:
    torch.manual_seed(1234)
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Dropout(p), torch.nn.GELU())
        for _ in range(depth)
    ]
    return torch.nn.Sequential(*blocks)


def grads_of(model: torch.nn.Module, x: torch.Tensor, run: Callable[[], torch.Tensor]):
    """Seed, run forward+backward, return (output, parameter grads + input grad)."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(7)
    out = run()
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    return out.detach(), grads


def assert_bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)


@pytest.fixture
def model_and_input():
    model = make_mlp()
    x = torch.randn(4, 16, requires_grad=True)
    return model, x


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_checkpoint_grads_bitwise_equal_with_dropout(model_and_input, reentrant):
    """CK-03: dropout inside the segment → grads bitwise equal to no checkpointing and to
    torch.utils.checkpoint; the global RNG ends where the uncheckpointed run leaves it."""
    model, x = model_and_input
    ref_out, ref = grads_of(model, x, lambda: model(x))
    ref_rng = torch.get_rng_state()
    out, ours = grads_of(model, x, lambda: checkpoint(model, x, use_reentrant=reentrant))
    ours_rng = torch.get_rng_state()
    _, theirs = grads_of(model, x, lambda: tuc.checkpoint(model, x, use_reentrant=reentrant))
    assert torch.equal(out, ref_out)
    assert_bitwise(ours, ref)
    assert_bitwise(ours, theirs)
    assert torch.equal(ours_rng, ref_rng)


@pytest.mark.parametrize("reentrant", VARIANTS)
@pytest.mark.parametrize("segments", [1, 2, 3, 6, "auto"])
def test_sequential_grads_bitwise_equal_with_dropout(model_and_input, reentrant, segments):
    """SEQ-04: checkpoint_sequential with dropout → grads bitwise equal to the plain model and
    to torch.utils.checkpoint.checkpoint_sequential."""
    model, x = model_and_input
    _, ref = grads_of(model, x, lambda: model(x))
    _, ours = grads_of(
        model, x, lambda: checkpoint_sequential(model, segments, x, use_reentrant=reentrant)
    )
    assert_bitwise(ours, ref)
    if segments != "auto":
        _, theirs = grads_of(
            model,
            x,
            lambda: tuc.checkpoint_sequential(model, segments, x, use_reentrant=reentrant),
        )
        assert_bitwise(ours, theirs)


def noisy(t: torch.Tensor) -> torch.Tensor:
    """A segment drawing from numpy's and Python's global RNGs as well as torch's."""
    np_mask = torch.from_numpy((np.random.rand(*t.shape) > 0.5).astype(np.float32))
    py_scale = random.random() + 0.5
    return torch.nn.functional.dropout(t.tanh(), 0.4, training=True) * np_mask * py_scale


def _np_state() -> tuple[bytes, int]:
    _, keys, pos, *_ = np.random.get_state()
    return keys.tobytes(), pos


def _seed_all() -> None:
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_numpy_and_python_rng_replayed(reentrant):
    """numpy's and Python's global RNG are stashed and replayed like torch's: same grads, and
    all three streams end where the uncheckpointed run leaves them."""
    x = torch.randn(5, 7, requires_grad=True)

    def run(ck: bool):
        x.grad = None
        _seed_all()
        out = checkpoint(noisy, x, use_reentrant=reentrant) if ck else noisy(x)
        out.sum().backward()
        after = (torch.get_rng_state(), _np_state(), random.getstate())
        return x.grad.clone(), after

    ref_grad, ref_after = run(False)
    grad, after = run(True)
    assert torch.equal(grad, ref_grad)
    assert torch.equal(after[0], ref_after[0])
    assert after[1] == ref_after[1]
    assert after[2] == ref_after[2]


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_preserve_rng_state_false_draws_new_numbers(reentrant):
    """CK-04: preserve_rng_state=False → the recompute draws new numbers (grads differ with
    dropout) and every global stream advances during backward; no error."""
    x = torch.randn(6, 16, requires_grad=True)

    def run(ck: bool):
        x.grad = None
        _seed_all()
        out = (
            checkpoint(noisy, x, use_reentrant=reentrant, preserve_rng_state=False)
            if ck
            else noisy(x)
        )
        before = (torch.get_rng_state(), _np_state(), random.getstate())
        out.sum().backward()
        after = (torch.get_rng_state(), _np_state(), random.getstate())
        return x.grad.clone(), before, after

    ref_grad, _, _ = run(False)
    grad, before, after = run(True)
    assert not torch.equal(grad, ref_grad)
    assert not torch.equal(before[0], after[0])
    assert before[1] != after[1]
    assert before[2] != after[2]


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_preserve_rng_state_false_touches_no_rng_state(monkeypatch, reentrant):
    """preserve_rng_state=False skips the stash entirely (the cheaper path): no RNG state is
    read or written, while True reads it at forward and around the recompute."""
    calls = {"get": 0, "set": 0, "np": 0}
    real_get, real_set, real_np = torch.get_rng_state, torch.set_rng_state, np.random.get_state

    def counting(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)

        return wrapper

    monkeypatch.setattr(torch, "get_rng_state", counting("get", real_get))
    monkeypatch.setattr(torch, "set_rng_state", counting("set", real_set))
    monkeypatch.setattr(np.random, "get_state", counting("np", real_np))
    x = torch.randn(3, requires_grad=True)
    checkpoint(torch.sin, x, use_reentrant=reentrant, preserve_rng_state=False).sum().backward()
    assert calls == {"get": 0, "set": 0, "np": 0}
    checkpoint(torch.sin, x, use_reentrant=reentrant).sum().backward()
    assert calls["get"] >= 2 and calls["set"] >= 2 and calls["np"] >= 2


def test_recompute_sees_autocast_state_of_forward():
    """CK-24 (autocast half): the recompute re-enters the forward's autocast settings even
    though backward runs outside the autocast block, so grads equal the uncheckpointed ones."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    seen: list[torch.dtype] = []

    def seg(t):
        y = lin(t)
        seen.append(y.dtype)
        return y.relu()

    def run(ck: bool):
        x.grad = None
        lin.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(seg, x) if ck else seg(x)
        out.float().sum().backward()
        return [x.grad.clone(), lin.weight.grad.clone()]

    ref = run(False)
    seen.clear()
    assert_bitwise(run(True), ref)
    assert seen == [torch.bfloat16, torch.bfloat16]  # forward and recompute


# ---------------------------------------------------------------------------------------------
# "auto" segments
# ---------------------------------------------------------------------------------------------


def test_split_points_follow_pytorch_rule():
    """SEQ-02 rule: segments-1 chunks of n // segments, the last chunk takes the rest."""
    assert split_points(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert split_points(7, 3) == [(0, 2), (2, 4), (4, 7)]
    assert split_points(5, 1) == [(0, 5)]


@pytest.mark.parametrize("n", list(range(1, 70)))
def test_auto_segments_minimizes_modelled_peak(n):
    """auto_segments is the exact argmin of segment_cost and sits near sqrt(2n) (Chen et al.
    2016's sqrt rule for the default cost ratio)."""
    k = auto_segments(n)
    costs = {s: segment_cost(n, s, 2.0, 1.0) for s in range(1, n + 1)}
    assert costs[k] == min(costs.values())
    if n >= 16:
        assert abs(k - math.sqrt(2 * n)) <= 0.5 * math.sqrt(2 * n)
    for ratio in (1.0, 4.0):
        k2 = auto_segments(n, ratio, 1.0)
        assert segment_cost(n, k2, ratio, 1.0) == min(
            segment_cost(n, s, ratio, 1.0) for s in range(1, n + 1)
        )


def test_auto_segments_known_values_and_errors():
    assert auto_segments(32) == 8
    assert auto_segments(1) == 1
    assert segment_cost(32, 8) == 7 + 2 * 4
    assert segment_cost(32, 1) == 64
    for bad in (0, -3):
        with pytest.raises(ValueError):
            auto_segments(bad)
    with pytest.raises(TypeError):
        auto_segments(3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        auto_segments(4, per_function=0.0)


# ---------------------------------------------------------------------------------------------
# Memory: bytes autograd keeps for backward, 32-layer MLP
# ---------------------------------------------------------------------------------------------


def saved_activation_bytes(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> int:
    """Bytes of distinct tensor storages autograd holds for backward at the end of forward,
    parameters excluded (they are alive anyway). Counted with saved_tensors_hooks; tensors
    packed by a checkpoint's own hooks are invisible here, exactly as they are not stored."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    total = sum(storages.values())
    out.sum().backward()  # the run must still be differentiable
    return total


def test_memory_32_layer_mlp_sqrt_and_auto():
    """32 Linear+GELU layers: sqrt(32) segments (5 or 6) keep >= 3x fewer bytes than no
    checkpointing, "auto" (8) keeps fewer still, and ours keeps exactly what
    torch.utils.checkpoint keeps. (GELU saves its input, so each layer keeps two activations;
    with ReLU the Linear and ReLU share one and the best possible ratio is about sqrt(n)/2,
    see docs/ACTIVATION.md.)"""
    torch.manual_seed(0)
    width = 32
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(32)]
    )
    x = torch.randn(8, width, requires_grad=True)
    activation = 8 * width * 4  # one [8, 32] float32 tensor

    none = saved_activation_bytes(model, lambda: model(x))
    assert none == 32 * 2 * activation  # each layer keeps Linear's input and GELU's input
    sqrt_n = math.sqrt(32)
    for k in (math.floor(sqrt_n), round(sqrt_n)):
        ours = saved_activation_bytes(model, lambda k=k: checkpoint_sequential(model, k, x))
        reent = saved_activation_bytes(
            model, lambda k=k: checkpoint_sequential(model, k, x, use_reentrant=True)
        )
        theirs = saved_activation_bytes(
            model, lambda k=k: tuc.checkpoint_sequential(model, k, x, use_reentrant=False)
        )
        assert ours == reent == theirs
        assert none / ours >= 3.0
    auto = saved_activation_bytes(model, lambda: checkpoint_sequential(model, "auto", x))
    assert auto < ours
    assert none / auto >= 4.0


# ---------------------------------------------------------------------------------------------
# Packaging
# ---------------------------------------------------------------------------------------------


def _run_without_torch(code: str) -> subprocess.CompletedProcess:
    prelude = "import sys\nsys.modules['torch'] = None  # makes `import torch` fail\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )


def test_import_without_torch_names_the_extra():
    """`import shardpoint.activation` without torch → ImportError naming shardpoint[torch];
    the base package and its errors still import."""
    res = _run_without_torch(
        """
        import shardpoint, shardpoint.errors
        try:
            import shardpoint.activation
        except ImportError as e:
            print("IMPORT-ERROR:", e)
        """
    )
    assert res.returncode == 0, res.stderr
    assert "IMPORT-ERROR:" in res.stdout
    assert "shardpoint[torch]" in res.stdout


def test_errors_are_shardpoint_checkpoint_errors():
    from shardpoint.activation import ActivationCheckpointError, RecomputeMismatchError

    assert issubclass(RecomputeMismatchError, ActivationCheckpointError)
    assert issubclass(ActivationCheckpointError, CheckpointError)
    assert issubclass(ActivationCheckpointError, RuntimeError)
