"""Catalog behaviours CK-01 … CK-24 and SEQ-01 … SEQ-04 (PyTorch's activation checkpointing).

Each test names the behaviour it covers. Where shardpoint deliberately differs from
torch.utils.checkpoint (a clear error where PyTorch crashes or is silently wrong, a different
default), the docstring says "difference" and docs/ACTIVATION.md lists it.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
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
from shardpoint.activation._state import RngSnapshot, accelerator_types  # noqa: E402
from shardpoint.errors import CheckpointError  # noqa: E402

VARIANTS = [pytest.param(False, id="nonreentrant"), pytest.param(True, id="reentrant")]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
REPO = Path(__file__).resolve().parents[2]


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_()


# --- CK-01 / CK-02 ----------------------------------------------------------------------------


def test_ck01_use_reentrant_omitted_means_nonreentrant_without_warning():
    """CK-01 (difference): omitting use_reentrant is not an error or a warning here; the
    default is use_reentrant=False (PyTorch warns and still defaults to True)."""
    x = leaf(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = checkpoint(lambda t: t * 2, x)
        seq = checkpoint_sequential([torch.tanh, torch.sin], 2, x)
    assert type(out.grad_fn).__name__ == "MulBackward0"
    assert type(seq.grad_fn).__name__ == "SinBackward0"


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck02_forward_once_recompute_once_per_backward(reentrant):
    """CK-02: forward calls the function once, each backward recomputes it once; reentrant
    output hangs off the checkpoint Function node, non-reentrant off ordinary op nodes."""
    calls = {"n": 0}

    def fn(t):
        calls["n"] += 1
        return t.exp().sum()

    out = checkpoint(fn, leaf(3), use_reentrant=reentrant)
    assert calls["n"] == 1
    name = type(out.grad_fn).__name__
    assert name == ("_ReentrantCheckpointBackward" if reentrant else "SumBackward0")
    out.backward()
    assert calls["n"] == 2


# --- CK-03 / CK-04 (RNG; the bitwise-equality tests are in test_activation.py) -----------------


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck03_global_rng_after_backward_is_where_forward_left_it(reentrant):
    """CK-03: forward advances the CPU RNG (dropout); backward leaves it exactly there."""
    x = leaf(50)
    before = torch.get_rng_state()
    out = checkpoint(lambda t: torch.nn.functional.dropout(t, 0.5), x, use_reentrant=reentrant)
    after_forward = torch.get_rng_state()
    out.sum().backward()
    assert not torch.equal(before, after_forward)
    assert torch.equal(torch.get_rng_state(), after_forward)


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck04_no_preserve_dropout_mask_differs(reentrant):
    """CK-04: preserve_rng_state=False → the recompute's dropout mask differs from forward's:
    the gradient's zero pattern no longer matches the output's."""
    torch.manual_seed(0)
    x = leaf(200)
    out = checkpoint(
        lambda t: torch.nn.functional.dropout(t, 0.5) * 1.0,
        x,
        use_reentrant=reentrant,
        preserve_rng_state=False,
    )
    out.sum().backward()
    assert not torch.equal(out != 0, x.grad != 0)


# --- CK-05 / CK-06 (device RNG) ----------------------------------------------------------------


def test_ck05_device_inference_is_recursive_and_skips_cpu_and_meta():
    """CK-05: devices come from tensors nested in lists/tuples/dicts; CPU and meta tensors have
    no device generator; CUDA is always considered (the seed's current-device rule)."""
    nested = ({"a": [torch.empty(1, device="meta")]}, torch.empty(1), 3, "s")
    assert accelerator_types(t for t in _tensors(nested)) == {"cuda": set()}


def _tensors(obj):
    from shardpoint.activation._common import iter_tensors

    return iter_tensors(obj)


def test_ck05_uninitialized_cuda_is_not_touched(monkeypatch):
    """CK-05: a device runtime that is not initialized at forward is never queried (reading it
    would initialize it): no get_rng_state call for it."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def boom(*a, **k):
        raise AssertionError("cuda RNG queried while uninitialized")

    monkeypatch.setattr(torch.cuda, "get_rng_state", boom)
    x = leaf(3)
    checkpoint(torch.sin, x).sum().backward()
    checkpoint(torch.sin, x, use_reentrant=True).sum().backward()


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck06_runtime_initialized_inside_forward_is_an_error(monkeypatch, reentrant):
    """CK-06: preserve_rng_state=True and the CUDA runtime gets initialized during the
    checkpointed forward → a clear error (its state could not be stashed). Both variants
    (PyTorch only checks the non-reentrant one). Simulated on CPU via is_initialized."""
    state = {"init": False}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["init"])

    def fn(t):
        state["init"] = True  # what creating the first CUDA tensor would do
        return t.sin()

    with pytest.raises(ActivationCheckpointError, match="initialized inside the forward"):
        checkpoint(fn, leaf(3), use_reentrant=reentrant)
    state["init"] = False
    checkpoint(fn, leaf(3), use_reentrant=reentrant, preserve_rng_state=False)  # fine


@needs_cuda
@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck05_cuda_dropout_bitwise_equal_and_rng_restored(reentrant):
    """CK-03/CK-05 on a GPU: CUDA dropout grads bitwise equal to no checkpointing, and the
    CUDA generator after backward is where the uncheckpointed run leaves it."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32).cuda()
    x = torch.randn(16, 32, device="cuda", requires_grad=True)

    def seg(t):
        return torch.nn.functional.dropout(lin(t), 0.5).relu()

    def run(ck):
        x.grad = None
        lin.zero_grad(set_to_none=True)
        torch.cuda.manual_seed(5)
        out = checkpoint(seg, x, use_reentrant=reentrant) if ck else seg(x)
        out.sum().backward()
        return [x.grad.clone(), lin.weight.grad.clone()], torch.cuda.get_rng_state()

    ref, ref_state = run(False)
    got, state = run(True)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert torch.equal(state, ref_state)


@needs_cuda
def test_ck05_cuda_devices_of_nested_arguments_are_stashed():
    """CK-05 on a GPU: a CUDA tensor nested in a dict argument adds its device's generator."""
    torch.cuda.init()
    snap = RngSnapshot(({"a": [torch.empty(1, device="cuda:0")]},))
    assert [index for _, index, _ in snap._devices] == [0]


@needs_cuda
def test_ck06_real_cuda_initialization_inside_forward():
    """CK-06 on a GPU, in a fresh process so that CUDA starts uninitialized."""
    code = """
        import torch
        from shardpoint.activation import checkpoint, ActivationCheckpointError
        x = torch.randn(3, requires_grad=True)
        try:
            checkpoint(lambda t: t.sin() + torch.zeros(3, device="cuda").sum().cpu(), x)
        except ActivationCheckpointError as e:
            print("RAISED", e)
    """
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "python"), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert "RAISED" in res.stdout, res.stderr


# --- CK-07 … CK-12 (inputs and outputs) --------------------------------------------------------


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck07_non_tensor_inputs_and_outputs_pass_through(reentrant):
    """CK-07: None/int/str inputs pass through; non-tensor outputs come back unchanged;
    several tensor outputs back-propagate independently."""
    x = leaf(3)

    def fn(n, t, none, flag, s):
        return n, t * 2, none, flag, s, t.sin()

    res = checkpoint(fn, 1, x, None, True, "s", use_reentrant=reentrant)
    assert [type(r).__name__ for r in res] == ["int", "Tensor", "NoneType", "bool", "str", "Tensor"]
    assert res[0] == 1 and res[2] is None and res[3] is True and res[4] == "s"
    res[1].sum().backward(retain_graph=True)
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    x.grad = None
    res[5].sum().backward()
    assert torch.allclose(x.grad, x.detach().cos())


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck08_nested_outputs(reentrant):
    """CK-08: tensors nested in list/dict outputs: reentrant → not attached to autograd;
    non-reentrant → attached, gradients flow."""
    x = leaf(3)
    out = checkpoint(lambda t: {"a": t * 2, "b": [t * 3]}, x, use_reentrant=reentrant)
    assert out["a"].requires_grad is (not reentrant)
    assert out["b"][0].requires_grad is (not reentrant)
    if not reentrant:
        (out["a"].sum() + out["b"][0].sum()).backward()
        assert torch.equal(x.grad, torch.full((3,), 5.0))


def test_ck09_nested_inputs_nonreentrant_get_gradients():
    """CK-09: tensors nested in container inputs get gradients (non-reentrant)."""
    x = leaf(3)
    out = checkpoint(lambda d: (d["k"][0] * 2).sum(), {"k": [x]})
    out.backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_ck09_nested_inputs_reentrant_clear_error():
    """CK-09 (difference): a tensor requiring grad nested in a container argument is invisible
    to the reentrant variant; PyTorch fails later with "element 0 of tensors does not require
    grad" or silently drops its gradient, shardpoint refuses up front with a clear ValueError."""
    with pytest.raises(ValueError, match="argument 0 is a dict holding a tensor"):
        checkpoint(lambda d: d["k"] * 2, {"k": leaf(3)}, use_reentrant=True)
    # Nested tensors that need no gradient are fine.
    out = checkpoint(lambda d, t: d["k"] * t, {"k": torch.ones(3)}, leaf(3), use_reentrant=True)
    out.sum().backward()


def test_ck10_no_input_requires_grad():
    """CK-10: no input requires grad: reentrant warns, output does not require grad, the
    parameters inside get no grad; non-reentrant still differentiates through parameters."""
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(lin, x, use_reentrant=True)
    assert not out.requires_grad
    out = checkpoint(lin, x, use_reentrant=False)
    assert out.requires_grad
    out.sum().backward()
    assert lin.weight.grad is not None


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck11_detached_output(reentrant):
    """CK-11: reentrant marks every tensor output as requiring grad, even a detached one;
    non-reentrant keeps the detached output detached."""
    x = leaf(3)
    y, z = checkpoint(lambda t: (t * 2, (t * 2).detach()), x, use_reentrant=reentrant)
    assert y.requires_grad
    assert z.requires_grad is reentrant
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_ck12_no_recomputed_output_requires_grad(reentrant):
    """CK-12: the outputs are computed under no_grad while an input requires grad: reentrant →
    clear ActivationCheckpointError at backward (a RuntimeError carrying PyTorch's gist);
    non-reentrant → no error, correct grads through the rest of the graph."""
    a = leaf(2, 2)

    def fn(t):
        with torch.no_grad():
            return t * 2

    out = checkpoint(fn, a, use_reentrant=reentrant)
    if reentrant:
        with pytest.raises(ActivationCheckpointError, match="none of output has requires_grad"):
            (out * a).sum().backward()
    else:
        assert not out.requires_grad
        (out * a).sum().backward()
        assert torch.equal(a.grad, a.detach() * 2)


# --- CK-13 … CK-16 (API limits and options) ---------------------------------------------------


def test_ck13_reentrant_rejects_grad_and_backward_inputs():
    """CK-13: reentrant + torch.autograd.grad or backward(inputs=...) → clear RuntimeError."""
    a = leaf(3)
    out = checkpoint(lambda t: t.sin() * 2, a, use_reentrant=True).sum()
    with pytest.raises(ActivationCheckpointError, match="incompatible with .grad()"):
        torch.autograd.grad(out, a, retain_graph=True)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        out.backward(inputs=[a])


def test_ck13_nonreentrant_supports_grad_inputs_and_create_graph():
    """CK-13: non-reentrant supports autograd.grad (incl. create_graph, double backward) and
    backward(inputs=...), with the same numbers as without checkpointing."""
    a = leaf(4)
    w = leaf(4)

    def fn(t, u):
        return torch.tanh(t * u * 3).sum()

    (g_ref,) = torch.autograd.grad(fn(a, w), a, create_graph=True)
    (gg_ref,) = torch.autograd.grad(g_ref.sum(), a)
    (g,) = torch.autograd.grad(checkpoint(fn, a, w), a, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), a)
    assert torch.equal(g, g_ref) and torch.equal(gg, gg_ref)
    checkpoint(fn, a, w).backward(inputs=[a])
    assert w.grad is None
    assert torch.equal(a.grad, g_ref.detach())


def test_ck14_keyword_arguments():
    """CK-14: reentrant + function kwargs → ValueError naming them; non-reentrant forwards
    them; preserve_rng_state is consumed by checkpoint and never forwarded."""
    x = leaf(3)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(lambda t, scale: t * scale, x, scale=2.0, use_reentrant=True)
    seen = {}

    def fn(t, scale=1.0, **rest):
        seen.update(rest)
        return t * scale

    out = checkpoint(fn, x, scale=3.0, preserve_rng_state=False)
    out.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))
    assert seen == {}


def test_ck15_context_fn_and_debug():
    """CK-15: reentrant + context_fn or debug → ValueError. Non-reentrant runs the forward and
    the recompute under context_fn's two managers. Difference: debug=True may be combined with
    a custom context_fn (PyTorch forbids it; our debug does not use context_fn)."""
    x = leaf(3)
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        checkpoint(torch.sin, x, use_reentrant=True, context_fn=lambda: (None, None))
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        checkpoint(torch.sin, x, use_reentrant=True, debug=True)

    log = []

    class Mark:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            log.append(self.name)

        def __exit__(self, *exc):
            return False

    out = checkpoint(torch.sin, x, context_fn=lambda: (Mark("fwd"), Mark("re")), debug=True)
    assert log == ["fwd"]
    out.sum().backward()
    assert log == ["fwd", "re"]


def test_ck16_determinism_check_validated():
    """CK-16: determinism_check outside {'default', 'none'} → ValueError."""
    with pytest.raises(ValueError, match=r"should be one of \['default', 'none'\], but got bogus"):
        checkpoint(torch.sin, leaf(3), determinism_check="bogus")


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
