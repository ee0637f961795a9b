"""Code written for torch.utils.checkpoint that swaps in shardpoint.activation.checkpoint keeps
flipping torch's own switches (``torch.utils.checkpoint.set_checkpoint_early_stop`` /
``set_checkpoint_debug_enabled``): they govern ours too, and the debug-mode error carries
torch's sentence (issue 32; torch's test_checkpoint_detects_non_determinism relies on both).
Torch's checkpoint runs the same code as the oracle."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tuc = pytest.importorskip("torch.utils.checkpoint")

from shardpoint.activation import (  # noqa: E402
    RecomputeMismatchError,
    checkpoint,
    set_checkpoint_debug_enabled,
    set_checkpoint_early_stop,
)

TORCH_DEBUG_SENTENCE = "You are seeing this error because you passed `debug=True` to checkpoint"


def ours(fn, *args, **kwargs):
    return checkpoint(fn, *args, **kwargs)


def theirs(fn, *args, **kwargs):
    return tuc.checkpoint(fn, *args, use_reentrant=False, **kwargs)


def _chain(trace):
    def fn(a):
        trace.append("start")
        b = a.sin()
        trace.append("after sin")
        c = b.cos()
        trace.append("after cos")
        return (c * 2.0).sum()  # the multiply by a constant saves nothing

    return fn


def _flaky():
    """Saves a (2,)-shaped tensor in the forward, a (4,)-shaped one in the recompute."""
    state = {"n": 0}

    def fn(t):
        state["n"] += 1
        return t.sin() if state["n"] == 1 else t.repeat(2).sin()[:2]

    return fn


@pytest.mark.parametrize("enable", [False, True])
def test_torchs_early_stop_switch_governs_our_checkpoint(enable):
    runs = {}
    for name, ck in (("torch", theirs), ("shardpoint", ours)):
        trace: list[str] = []
        with tuc.set_checkpoint_early_stop(enable):
            out = ck(_chain(trace), torch.randn(3, requires_grad=True))
        trace.clear()
        out.backward()
        runs[name] = trace
    assert runs["shardpoint"] == runs["torch"]
    expected = ["start", "after sin"] if enable else ["start", "after sin", "after cos"]
    assert runs["shardpoint"] == expected


def test_our_early_stop_switch_wins_over_torchs():
    trace: list[str] = []
    with tuc.set_checkpoint_early_stop(True), set_checkpoint_early_stop(False):
        out = ours(_chain(trace), torch.randn(3, requires_grad=True))
    trace.clear()
    out.backward()
    assert trace == ["start", "after sin", "after cos"]


@pytest.mark.parametrize(
    ("switch", "argument", "debug_report"),
    [(True, False, True), (False, True, False), (None, True, True), (None, False, False)],
)
def test_torchs_debug_switch_governs_our_checkpoint(switch, argument, debug_report):
    for ck in (theirs, ours):
        with tuc.set_checkpoint_debug_enabled(switch):
            out = ck(_flaky(), torch.randn(2, requires_grad=True), debug=argument)
        with pytest.raises(RuntimeError) as info:
            out.sum().backward()
        text = str(info.value)
        assert (TORCH_DEBUG_SENTENCE in text) is debug_report, (ck.__name__, text[-600:])
        if ck is theirs:  # torch's debug error replaces the mismatch message
            assert ("have different metadata" in text) is not debug_report
        else:  # ours keeps it in both modes, the operator logs come after it
            assert "have different metadata" in text
    assert isinstance(info.value, RecomputeMismatchError)


def test_our_debug_switch_wins_over_torchs():
    with tuc.set_checkpoint_debug_enabled(True), set_checkpoint_debug_enabled(False):
        out = ours(_flaky(), torch.randn(2, requires_grad=True))
    with pytest.raises(RecomputeMismatchError) as info:
        out.sum().backward()
    assert TORCH_DEBUG_SENTENCE not in str(info.value)


def test_debug_error_has_torchs_headline_and_sentence():
    """Torch's debug error (its operator logs aside) and ours share the headline and the
    sentence users and torch's own tests match; ours still names the mismatching tensor."""
    errors = {}
    for ck in (theirs, ours):
        out = ck(_flaky(), torch.randn(2, requires_grad=True), debug=True)
        with pytest.raises(RuntimeError) as info:
            out.sum().backward()
        errors[ck.__name__] = str(info.value)
    for text in errors.values():
        assert "Detected non-determinism while running activation checkpointing" in text
        assert TORCH_DEBUG_SENTENCE in text
    assert "have different metadata than during the forward pass" in errors["ours"]
