"""Reentrant activation checkpointing: one autograd Function per checkpointed call.

The forward runs the function under ``no_grad`` and saves only its inputs; the Function's
backward re-runs it with grad enabled and calls ``torch.autograd.backward`` on the recomputed
outputs (a nested, "reentrant" backward). This is the design of the seed document. Its limits
follow from that design and are reported as clear errors instead of wrong or missing
gradients: see docs/ACTIVATION.md.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ._common import SLOT, ActivationCheckpointError, iter_tensors
from ._state import AutocastState, DeviceContext, RngSnapshot, accelerator_types

__all__ = ["checkpoint_reentrant", "REENTRANT_GRAD_ERROR"]

REENTRANT_GRAD_ERROR = (
    # PyTorch's exact sentence first (``match=`` and ``except`` written for it keep working),
    # then why.
    "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing "
    "an `inputs` parameter to .backward(). To resolve this error, you can either set "
    "use_reentrant=False, or call .backward() without passing the `inputs` argument. "
    "(shardpoint.activation.checkpoint(use_reentrant=True) re-runs the segment with its own "
    "nested backward, which can only accumulate into .grad.)"
)


def _checkpoint_valid() -> bool:
    # torch knows whether the current backward was started by .grad() / backward(inputs=...),
    # the case where a nested backward would write gradients nobody asked for.
    probe = getattr(torch.autograd, "_is_checkpoint_valid", None)
    return True if probe is None else bool(probe())


class _ReentrantCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run_fn: Callable[..., Any], preserve_rng_state: bool, *args: Any) -> Any:
        ctx.run_fn = run_fn
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        ctx.rng = RngSnapshot(args) if preserve_rng_state else None
        ctx.autocast = AutocastState(accelerator_types(tensors))
        ctx.device_ctx = DeviceContext()
        # Non-tensor arguments stay in ctx; tensors go through save_for_backward so that outer
        # saved-tensor hooks apply and in-place changes before backward are detected.
        ctx.layout = [SLOT if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*tensors)
        output = run_fn(*args)  # autograd.Function runs forward under no_grad
        if ctx.rng is not None:
            ctx.rng.check_no_new_runtime()
        return output

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:
        if not _checkpoint_valid():
            raise ActivationCheckpointError(REENTRANT_GRAD_ERROR)
        saved = iter(ctx.saved_tensors)
        inputs = []
        for item in ctx.layout:
            if item is SLOT:
                t = next(saved)
                # Detached leaves: the nested backward must stop here, and hand the gradients
                # back to autograd through our return value.
                item = t.detach().requires_grad_(t.requires_grad)
            inputs.append(item)
        with contextlib.ExitStack() as stack:
            if ctx.rng is not None:
                stack.enter_context(ctx.rng.replay())
            ctx.autocast.enter(stack)
            ctx.device_ctx.enter(stack)
            stack.enter_context(torch.enable_grad())
            outputs = ctx.run_fn(*inputs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        roots, grads = [], []
        for out, grad in zip(outputs, grad_outputs, strict=False):
            if isinstance(out, torch.Tensor) and out.requires_grad:
                roots.append(out)
                grads.append(grad)
        if not roots:
            raise ActivationCheckpointError(
                "none of output has requires_grad=True, this checkpoint() is not necessary: "
                "with use_reentrant=True the recomputed outputs of the function do not depend "
                "on any input or parameter that requires grad (the function detaches them or "
                "computes them under torch.no_grad()). Detach outside the checkpoint, or use "
                "use_reentrant=False, which handles such outputs."
            )
        torch.autograd.backward(roots, grads)
        input_grads = tuple(inp.grad if isinstance(inp, torch.Tensor) else None for inp in inputs)
        return (None, None, *input_grads)


def checkpoint_reentrant(
    fn: Callable[..., Any], args: tuple[Any, ...], *, preserve_rng_state: bool
) -> Any:
    """Run ``fn(*args)`` through :class:`_ReentrantCheckpoint`."""
    if not torch.is_grad_enabled():
        return fn(*args)
    for position, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            continue
        if any(t.requires_grad for t in iter_tensors(arg)):
            raise ValueError(
                f"checkpoint(use_reentrant=True): argument {position} is a "
                f"{type(arg).__name__} holding a tensor that requires grad. The reentrant "
                "variant only sees top-level tensor arguments, so that tensor would get no "
                "gradient. Pass the tensor as a separate argument, or use use_reentrant=False."
            )
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        warnings.warn(
            "None of the inputs have requires_grad=True. Gradients will be None "
            "(use_reentrant=True only differentiates through tensor arguments; parameters "
            "used inside the function get no gradient either; use_reentrant=False does not "
            "have this limit)",
            UserWarning,
            stacklevel=3,
        )
    return _ReentrantCheckpoint.apply(fn, preserve_rng_state, *args)
