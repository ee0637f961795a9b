"""Catalog behaviours CK-17 … CK-24 and SEQ-01 … SEQ-04 (PyTorch's activation checkpointing):
recompute checks, early stop, freeing, no_grad forwards, in-place inputs, nesting and
checkpoint_sequential. CK-01 … CK-16 are in test_activation_catalog.py.

Each test names the behaviour it covers. Where shardpoint deliberately differs from
torch.utils.checkpoint, the docstring says "difference" and docs/ACTIVATION.md lists it.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from shardpoint.activation import (  # noqa: E402
    ActivationCheckpointError,
    RecomputeMismatchError,
    checkpoint,
    checkpoint_sequential,
    set_checkpoint_early_stop,
)
from shardpoint.errors import CheckpointError  # noqa: E402

VARIANTS = [pytest.param(False, id="nonreentrant"), pytest.param(True, id="reentrant")]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
REPO = Path(__file__).resolve().parents[2]


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_()


# --- CK-17 … CK-21 (recompute checks, early stop, freeing) -------------------------------------


def _flaky(kind: str):
    calls = {"n": 0}

    def fn(a):
        calls["n"] += 1
        first = calls["n"] == 1
        if kind == "shape":
            b = a[: 3 if first else 2]
        else:
            b = a if first else a.double()
        return (b * b).sum()

    return fn


@pytest.mark.parametrize("kind", ["shape", "dtype"])
def test_ck17_metadata_mismatch_is_a_clear_error(kind):
    """CK-17: a recomputed saved tensor with a different shape/dtype → RecomputeMismatchError
    (a CheckpointError and RuntimeError) naming the position and both metadata."""
    out = checkpoint(_flaky(kind), leaf(4))
    with pytest.raises(RecomputeMismatchError, match="tensor at position 0") as info:
        out.backward()
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert "saved metadata" in msg and "recomputed metadata" in msg
    assert ("(3,)" in msg and "(2,)" in msg) if kind == "shape" else "torch.float64" in msg


def test_ck17_debug_names_the_source_lines():
    """CK-17 + debug=True: the error says where each mismatching tensor was saved."""
    out = checkpoint(_flaky("shape"), leaf(4), debug=True)
    with pytest.raises(RecomputeMismatchError, match=r"saved at: .*test_activation_catalog"):
        out.backward()


def test_ck17_check_disabled_and_reentrant_never_checks():
    """CK-17: determinism_check='none' skips the check (the op itself then fails on the shape
    change); the reentrant variant never checks (the changed recompute just runs)."""
    out = checkpoint(_flaky("shape"), leaf(4), determinism_check="none")
    with pytest.raises(RuntimeError, match="must match the size") as info:
        out.backward()
    assert not isinstance(info.value, RecomputeMismatchError)
    checkpoint(_flaky("shape"), leaf(4), use_reentrant=True).backward()


def _saves(extra_on_recompute: bool, fewer_on_recompute: bool = False):
    calls = {"n": 0}

    def fn(a):
        calls["n"] += 1
        y = a.sin()
        if calls["n"] > 1 and extra_on_recompute:
            y = y.cos() * y.exp()
        if calls["n"] == 1 and fewer_on_recompute:
            y = y.cos()
        return y.sum()

    return fn


def test_ck18_tensor_count_mismatch():
    """CK-18: recompute saves fewer tensors → error with both counts; more with early stop
    off → error; more with early stop on → fine (stops once the forward's are there)."""
    with pytest.raises(RecomputeMismatchError, match="forward: 2\nNumber .*recomputation: 1"):
        checkpoint(_saves(False, fewer_on_recompute=True), leaf(3)).backward()
    with set_checkpoint_early_stop(False):
        out = checkpoint(_saves(True), leaf(3))
    with pytest.raises(
        RecomputeMismatchError,
        match="trying to save more tensors during recomputation than during the original forward pass",
    ):
        out.backward()
    checkpoint(_saves(True), leaf(3)).backward()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("early", ["start", "after sin"]),
        ("kwarg-off", ["start", "after sin", "after cos", "after mul"]),
        ("context-off", ["start", "after sin", "after cos", "after mul"]),
        ("reentrant", ["start", "after sin", "after cos", "after mul"]),
    ],
)
def test_ck19_early_stop(mode, expected):
    """CK-19: non-reentrant recompute stops after the last saving op by default; early_stop=
    False or set_checkpoint_early_stop(False) at forward re-runs everything; reentrant always
    re-runs everything."""
    trace = []

    def chain(a):
        trace.append("start")
        b = a.sin()
        trace.append("after sin")
        c = b.cos()
        trace.append("after cos")
        d = c * 2.0  # saves nothing
        trace.append("after mul")
        return d.sum()

    a = leaf(3)
    if mode == "context-off":
        with set_checkpoint_early_stop(False):
            out = checkpoint(chain, a)
    else:
        out = checkpoint(chain, a, use_reentrant=mode == "reentrant", early_stop=mode == "early")
    trace.clear()
    out.backward()
    assert trace == expected


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck20_backward_twice(reentrant):
    """CK-20: a second backward without retain_graph → autograd's standard error; with
    retain_graph=True each backward recomputes and grads accumulate."""
    calls = {"n": 0}

    def fn(t):
        calls["n"] += 1
        return t.sin().sum()

    a = leaf(3)
    out = checkpoint(fn, a, use_reentrant=reentrant)
    out.backward(retain_graph=True)
    out.backward()
    assert calls["n"] == 3
    assert torch.allclose(a.grad, 2 * a.detach().cos())
    out = checkpoint(fn, leaf(3), use_reentrant=reentrant)
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


def test_ck21_recomputed_tensor_freed_after_use_even_with_retain_graph():
    """CK-21: each recomputed tensor is dropped right after its one use, even with
    retain_graph=True (without checkpointing the graph keeps it alive)."""
    refs = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t * 1

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            refs.append(weakref.ref(t))
            return g * t

    x = leaf(4)

    def fn(t):
        return Spy.apply(t.sin()).cos()

    for use_checkpoint, freed in ((False, False), (True, True)):
        refs.clear()
        out = checkpoint(fn, x) if use_checkpoint else fn(x)
        out.sum().backward(retain_graph=True)
        gc.collect()
        assert (refs[0]() is None) is freed
        del out


def test_ck21_unpacking_twice_is_an_error():
    """CK-21: reading the same saved tensor twice in one backward → clear error."""

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t * 2

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            (t2,) = ctx.saved_tensors
            return g * 2

    out = checkpoint(lambda t: Twice.apply(t.sin()), leaf(3))
    with pytest.raises(
        ActivationCheckpointError,
        match="Unpack is being triggered for a tensor that was already unpacked once",
    ):
        out.sum().backward()


# --- CK-22 … CK-24 -----------------------------------------------------------------------------


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck22_forward_under_no_grad(reentrant):
    """CK-22: under torch.no_grad() the function runs once, output does not require grad."""
    calls = {"n": 0}

    def fn(t):
        calls["n"] += 1
        return t.sin()

    with torch.no_grad():
        out = checkpoint(fn, leaf(3), use_reentrant=reentrant)
    assert not out.requires_grad and calls["n"] == 1


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck23_input_modified_in_place_before_backward(reentrant):
    """CK-23: a checkpoint input modified in place between forward and backward → autograd's
    version-counter error (both variants)."""
    a = leaf(3)
    x = a * 1
    out = checkpoint(lambda t: t.sin().sum(), x, use_reentrant=reentrant)
    with torch.no_grad():
        x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize(("reentrant", "inner_calls"), [(False, 2), (True, 3)])
def test_ck24_nested_checkpoints(reentrant, inner_calls):
    """CK-24: nested checkpoints give correct grads; the non-reentrant outer recompute stops
    before re-running the inner function (2 calls), reentrant re-runs it (3 calls).
    Difference: the reentrant inner call made during the outer no-grad forward does not warn
    about inputs without grad (it is not checkpointed at all there)."""
    calls = {"n": 0}

    def inner(t):
        calls["n"] += 1
        return t.exp().sum()

    def outer(t):
        return checkpoint(inner, t.sin(), use_reentrant=reentrant) * 2

    a = leaf(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = checkpoint(outer, a, use_reentrant=reentrant)
        out.backward()
    assert calls["n"] == inner_calls
    b = a.detach().clone().requires_grad_()
    outer_plain = b.sin().exp().sum() * 2
    outer_plain.backward()
    assert torch.allclose(a.grad, b.grad)


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck24_device_context_reapplied(reentrant):
    """CK-24: a `with torch.device(...)` active at forward is active again in the recompute."""
    seen = []

    def fn(t):
        seen.append(torch.empty(1).device.type)
        return t.sin()

    a = leaf(3)
    with torch.device("meta"):
        out = checkpoint(fn, a, use_reentrant=reentrant)
    out.sum().backward()
    assert seen == ["meta", "meta"]


# --- SEQ-01 … SEQ-04 ---------------------------------------------------------------------------


def _counting(n: int):
    calls = [0] * n

    def make(i):
        def f(t):
            calls[i] += 1
            return t.sin() if i % 2 else t.tanh()  # both save a tensor for backward

        return f

    return [make(i) for i in range(n)], calls


def test_seq01_accepted_inputs_and_errors():
    """SEQ-01: nn.Sequential or a list of modules/functions, exactly one input; a missing or
    extra positional input → TypeError; an unknown keyword → ValueError; use_reentrant may be
    omitted (difference: no warning, non-reentrant default)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    x = leaf(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint_sequential(model, 2, x).shape == (2, 2)
        assert checkpoint_sequential(list(model), 2, x, preserve_rng_state=False).shape == (2, 2)
    with pytest.raises(TypeError):
        checkpoint_sequential(model, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        checkpoint_sequential(model, 2, x, False, True, x)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        checkpoint_sequential(model, 2, x, foo=1)
    with pytest.raises(TypeError, match="nn.Sequential or a list"):
        checkpoint_sequential(torch.nn.Linear(3, 3), 1, x)


@pytest.mark.parametrize("reentrant", VARIANTS)
@pytest.mark.parametrize(
    ("n", "segments", "twice"),
    [(10, 2, 5), (10, 3, 6), (7, 3, 4), (5, 5, 4), (4, 1, 0)],
)
def test_seq02_which_functions_are_recomputed(reentrant, n, segments, twice):
    """SEQ-02: the first segments-1 chunks of n // segments functions are checkpointed (called
    twice after backward), the last chunk with the remainder runs once."""
    fns, calls = _counting(n)
    out = checkpoint_sequential(fns, segments, leaf(4), use_reentrant=reentrant)
    assert calls == [1] * n
    out.sum().backward()
    assert calls == [2] * twice + [1] * (n - twice)


@pytest.mark.parametrize(
    ("segments", "error", "match"),
    [
        (4, ValueError, r"segments \(4\) must not exceed the number of functions \(3\)"),
        (0, ValueError, "segments must be at least 1, got 0"),
        (-1, ValueError, "segments must be at least 1"),
        (1.5, TypeError, "segments must be an int or 'auto'"),
        (True, TypeError, "segments must be an int or 'auto'"),
        ("sqrt", ValueError, "segments must be an int or 'auto'"),
    ],
)
def test_seq03_bad_segment_counts_are_clear_errors(segments, error, match):
    """SEQ-03 (difference): segments > len(functions) and segments = 0 give clear ValueErrors
    (PyTorch: "range() arg 3 must not be zero" and ZeroDivisionError)."""
    fns, _ = _counting(3)
    with pytest.raises(error, match=match):
        checkpoint_sequential(fns, segments, leaf(4))


def test_seq03_empty_function_list():
    with pytest.raises(ValueError, match="at least one function"):
        checkpoint_sequential([], "auto", leaf(4))


def test_seq04_reentrant_sequential_rejects_autograd_grad():
    """SEQ-04: with use_reentrant=True, torch.autograd.grad on the output → the CK-13 error;
    non-reentrant gives the uncheckpointed gradient."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
    x = leaf(2, 4)
    out = checkpoint_sequential(model, 2, x, use_reentrant=True)
    with pytest.raises(ActivationCheckpointError, match="incompatible with .grad()"):
        torch.autograd.grad(out.sum(), x)
    (ref,) = torch.autograd.grad(model(x).sum(), x)
    (got,) = torch.autograd.grad(checkpoint_sequential(model, 2, x).sum(), x)
    assert torch.equal(ref, got)
