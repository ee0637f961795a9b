"""Catalog behaviours CK-01 … CK-16 (PyTorch's activation checkpointing; CK-17 … CK-24 and SEQ-01 …
SEQ-04: test_activation_catalog_recompute.py).

Each test names the behaviour it covers. Where shardpoint deliberately differs from
torch.utils.checkpoint (a clear error where PyTorch crashes or is silently wrong, a different
default), the docstring says "difference" and docs/ACTIVATION.md lists it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from shardpoint.activation import (  # noqa: E402
    ActivationCheckpointError,
    checkpoint,
    checkpoint_sequential,
)
from shardpoint.activation._state import RngSnapshot, accelerator_types  # noqa: E402

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
