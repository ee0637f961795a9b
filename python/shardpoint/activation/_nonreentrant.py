"""Non-reentrant activation checkpointing, built on saved-tensor hooks.

How it works. During the checkpointed forward a ``saved_tensors_hooks`` pair is active: every
tensor that autograd wants to keep for backward is replaced by a small :class:`_Holder` (its
position in save order). The autograd graph is the ordinary one, so ``torch.autograd.grad``,
``backward(inputs=...)``, keyword arguments and nested outputs all just work. The first time
backward unpacks one of the holders, the whole function is run again under a second hook pair
that routes the i-th tensor saved during the recompute to holder i; the recompute stops
(``_StopRecompute``) as soon as the last holder is filled. Each recomputed tensor is handed out
once and dropped, so memory is released as backward proceeds.

The checkpoint's inputs are saved by a no-op autograd function (:class:`_SaveInputs`) rather
than kept in a Python list: they then pass through whatever saved-tensor hooks are active
outside the checkpoint (an outer checkpoint, ``save_on_cpu``, a memory counter), and autograd's
version counter reports an input modified in place before backward.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ._common import (
    ActivationCheckpointError,
    RecomputeMismatchError,
    blank_tensors,
    fill_tensors,
    iter_tensors,
)
from ._state import AutocastState, DeviceContext, RngSnapshot, accelerator_types

__all__ = ["checkpoint_nonreentrant"]

_FRESH_IDS = itertools.count(start=1 << 62)  # ids for unpacks that happen outside a backward
_THIS_FILE = __file__


class _StopRecompute(Exception):
    """Raised from the recompute pack hook once every needed tensor exists again."""


class _Holder:
    """What autograd stores instead of an activation: the tensor's position in save order."""

    __slots__ = ("index", "__weakref__")

    def __init__(self, index: int) -> None:
        self.index = index


class _SaveInputs(torch.autograd.Function):
    """Saves the checkpoint's input tensors in the graph; its backward never runs."""

    @staticmethod
    def forward(ctx: Any, dummy: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*tensors)
        return dummy.new_empty((0,))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # pragma: no cover - unreachable by design
        # The output is never used by anything, so autograd never schedules this node.
        raise AssertionError("shardpoint.activation: _SaveInputs.backward must not run")


def _metadata(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": t.device}


def _call_site() -> str:
    """The innermost stack frame outside torch and this module (only used with debug=True)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename != _THIS_FILE and "/torch/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


class _Frame:
    """Everything one checkpointed call needs to recompute itself during backward."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rng: RngSnapshot | None,
        autocast: AutocastState,
        device_ctx: DeviceContext,
        recompute_ctx: contextlib.AbstractContextManager[Any] | None,
        check_metadata: bool,
        early_stop: bool,
        debug: bool,
    ) -> None:
        self.fn = fn
        # Tensors are blanked out here: they live in the graph (see _SaveInputs) so that outer
        # saved-tensor hooks see them and a strong Python reference does not pin them.
        self.args = blank_tensors(args)
        self.kwargs = blank_tensors(kwargs)
        self.rng = rng
        self.autocast = autocast
        self.device_ctx = device_ctx
        self.recompute_ctx = recompute_ctx
        self.check_metadata = check_metadata
        self.early_stop = early_stop
        self.debug = debug
        self.input_node: Any = None  # grad_fn of _SaveInputs, owns the saved inputs
        self.holders: list[weakref.ref[_Holder]] = []
        self.metadata: list[dict[str, Any]] = []
        self.sites: list[str] = []  # where each tensor was saved (debug only)
        self.forward_done = False
        # Per backward pass (graph task id): recomputed tensors not yet handed out.
        self.recomputed: dict[int, dict[int, torch.Tensor]] = {}
        self.finished: set[int] = set()
        self.lock = threading.RLock()

    # -- forward ---------------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> _Holder:
        holder = _Holder(len(self.holders))
        self.holders.append(weakref.ref(holder))
        if self.check_metadata:
            self.metadata.append(_metadata(t))
        if self.debug:
            self.sites.append(_call_site())
        return holder

    # -- backward --------------------------------------------------------------------------
    def unpack(self, holder: _Holder) -> torch.Tensor:
        gid = torch._C._current_graph_task_id()
        if gid == -1:
            # Unpacked outside of a backward pass (e.g. reading grad_fn._saved_self).
            gid = next(_FRESH_IDS)
        with self.lock:
            if gid not in self.finished:
                if not self.forward_done:
                    raise ActivationCheckpointError(
                        "shardpoint.activation: a tensor saved inside a non-reentrant "
                        "checkpoint was needed by a backward pass that ran before the "
                        "checkpointed function returned (autograd called inside the "
                        "function). Compute those gradients outside the checkpoint."
                    )
                self.recomputed[gid] = self._recompute(gid)
                self.finished.add(gid)
            store = self.recomputed.get(gid, {})
            tensor = store.pop(holder.index, None)
            if not store:
                self.recomputed.pop(gid, None)
        if tensor is None:
            raise ActivationCheckpointError(
                "shardpoint.activation: a tensor saved by a checkpointed function was unpacked "
                "twice in one backward pass. Each recomputed tensor is freed after its first "
                "use to save memory; if a custom autograd Function reads ctx.saved_tensors "
                "more than once in backward, read it once and reuse the result."
            )
        return tensor

    def _recompute(self, gid: int) -> dict[int, torch.Tensor]:
        saved = iter(self.input_node.saved_tensors)  # raises if an input was modified in place
        args = fill_tensors(self.args, saved)
        kwargs = fill_tensors(self.kwargs, saved)
        expected = len(self.holders)
        store: dict[int, torch.Tensor] = {}
        recomputed_meta: list[dict[str, Any]] = []
        recomputed_sites: list[str] = []
        count = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal count
            index = count
            count += 1
            if index >= expected:
                raise RecomputeMismatchError(
                    "shardpoint.activation: the recompute tried to save more tensors than the "
                    f"original forward pass ({expected}); the checkpointed function does not "
                    "behave the same way twice (global state, data-dependent control flow)."
                    + self._debug_hint()
                )
            holder = self.holders[index]()
            if holder is not None:  # dead when that part of the graph was already freed
                store[index] = t.detach() if t.requires_grad else t
            if self.check_metadata:
                recomputed_meta.append(_metadata(t))
            if self.debug:
                recomputed_sites.append(_call_site())
            if self.early_stop and count == expected:
                raise _StopRecompute
            return t

        def unpack(t: torch.Tensor) -> torch.Tensor:
            return t

        with contextlib.ExitStack() as stack:
            if self.rng is not None:
                stack.enter_context(self.rng.replay())
            self.autocast.enter(stack)
            self.device_ctx.enter(stack)
            if self.recompute_ctx is not None:
                stack.enter_context(self.recompute_ctx)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
            stack.enter_context(torch.enable_grad())
            try:
                self.fn(*args, **kwargs)
            except _StopRecompute:
                pass

        if count != expected:
            raise RecomputeMismatchError(
                "shardpoint.activation: a different number of tensors was saved during the "
                "original forward and the recompute.\n"
                f"Number of tensors saved during forward: {expected}\n"
                f"Number of tensors saved during recomputation: {count}." + self._debug_hint()
            )
        if self.check_metadata:
            self._check_metadata(recomputed_meta, recomputed_sites)
        return store

    def _check_metadata(self, recomputed: list[dict[str, Any]], sites: list[str]) -> None:
        lines = []
        for i, (before, after) in enumerate(zip(self.metadata, recomputed, strict=True)):
            if before != after:
                lines.append(
                    f"tensor at position {i}:\nsaved metadata: {before}\n"
                    f"recomputed metadata: {after}"
                )
                if self.debug:
                    lines.append(f"  saved at: {self.sites[i]}\n  recomputed at: {sites[i]}")
        if lines:
            raise RecomputeMismatchError(
                "shardpoint.activation: recomputed values for the following tensors have "
                "different metadata (shape, dtype, device) than during the forward pass:\n"
                + "\n".join(lines)
                + self._debug_hint()
            )

    def _debug_hint(self) -> str:
        if self.debug:
            return ""
        return "\nPass debug=True to checkpoint(...) to see where each tensor was saved."


def checkpoint_nonreentrant(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    preserve_rng_state: bool,
    context_fn: Callable[[], tuple[Any, Any]] | None,
    check_metadata: bool,
    early_stop: bool,
    debug: bool,
) -> Any:
    """Run ``fn(*args, **kwargs)`` so that its activations are recomputed during backward."""
    if not torch.is_grad_enabled():
        # Nothing will be saved for backward, so there is nothing to checkpoint.
        return fn(*args, **kwargs)

    forward_ctx, recompute_ctx = context_fn() if context_fn is not None else (None, None)
    tensors = [*iter_tensors(args), *iter_tensors(kwargs)]
    rng = RngSnapshot((args, kwargs)) if preserve_rng_state else None
    frame = _Frame(
        fn,
        args,
        kwargs,
        rng,
        AutocastState(accelerator_types(tensors)),
        DeviceContext(),
        recompute_ctx,
        check_metadata,
        early_stop,
        debug,
    )
    # The dummy requires grad so that _SaveInputs gets a graph node even when no input does
    # (parameters used inside the function still need their gradients).
    dummy = torch.empty((0,), requires_grad=True)
    frame.input_node = _SaveInputs.apply(dummy, *tensors).grad_fn

    with contextlib.ExitStack() as stack:
        if forward_ctx is not None:
            stack.enter_context(forward_ctx)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack))
        output = fn(*args, **kwargs)
    frame.forward_done = True
    if rng is not None:
        rng.check_no_new_runtime()
    return output
