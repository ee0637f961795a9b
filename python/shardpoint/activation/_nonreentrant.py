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
import time
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
from ._debug import OpLog, format_debug_report
from ._memory import active_meters
from ._state import AutocastState, DeviceContext, RngSnapshot, accelerator_types

__all__ = ["checkpoint_nonreentrant"]

_FRESH_IDS = itertools.count(start=1 << 62)  # ids for unpacks that happen outside a backward
_THIS_FILE = __file__


DEBUG_TIP = (
    "\nTip: to see the operators that ran in the forward and in the recomputation, pass "
    "`debug=True` to checkpoint(...) or wrap the code in "
    "`with shardpoint.activation.set_checkpoint_debug_enabled(True):`."
)

# PyTorch's wording for the errors that users' ``except``/``match=`` clauses rely on; each is
# prefixed with where it comes from.
UNPACKED_TWICE = (
    "Unpack is being triggered for a tensor that was already unpacked once. {extra}If you are "
    "calling ctx.saved_tensors in backward, make sure to do so only once. (shardpoint frees "
    "each recomputed tensor after its first use to save memory; read ctx.saved_tensors once "
    "and reuse the result.)"
)
GRAPH_EXEC_GROUP_OVERLAP = (
    "Performing two backward calls that overlap (i.e. require the same saved activation in "
    "order to compute gradients) is not allowed while under the "
    "torch.utils.checkpoint.GraphExecGroup context. "
)


class _InputBox:
    """A checkpoint input as _SaveInputs stores it: releasable, and passed through the hooks
    that were active outside (``outer``), as autograd would have done."""

    __slots__ = ("value", "unpack", "released", "version")

    def __init__(self, t: torch.Tensor, outer: tuple[Any, Any] | None) -> None:
        self.value: Any = outer[0](t) if outer is not None else t
        self.unpack = outer[1] if outer is not None else None
        self.released = False
        # Autograd checks versions only for tensors it stores itself; do it for the boxed ones.
        self.version = t._version

    def get(self) -> torch.Tensor:
        if self.released:
            raise ActivationCheckpointError(
                "shardpoint.activation: the inputs of this checkpoint were already freed: its "
                "part of the graph was used by a backward pass without retain_graph=True. "
                "Trying to backward through the graph a second time? Specify "
                "retain_graph=True on the first backward."
            )
        if self.unpack is not None:
            return self.unpack(self.value)
        t = self.value
        if t._version != self.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{t.type()} {list(t.shape)}] (an input of a "
                f"shardpoint.activation checkpoint) is at version {t._version}; expected "
                f"version {self.version} instead."
            )
        return t

    def release(self) -> None:
        self.value = None
        self.released = True


def _holder_died_callback(frame: _Frame) -> Callable[[Any], None]:
    frame_ref = weakref.ref(frame)

    def died(_ref: Any) -> None:
        alive = frame_ref()
        if alive is not None:
            alive.live_holders -= 1
            alive.release_inputs_if_unused()

    return died


_TIMERS: list[RecomputeTimer] = []
_NESTING = threading.local()


class RecomputeTimer:
    """Context manager adding up the wall time non-reentrant checkpoints spend recomputing
    (outermost recomputes only; nested ones run inside them). For benchmarks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    def __enter__(self) -> RecomputeTimer:
        _TIMERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _TIMERS.remove(self)


class _Kept:
    """A recomputed tensor waiting for backward, counted by the active memory meters until it
    is handed out (or its frame dies)."""

    __slots__ = ("tensor", "holds")

    def __init__(self, tensor: torch.Tensor, original: torch.Tensor) -> None:
        self.tensor = tensor
        # Judged on the undetached tensor: a detached parameter no longer looks like one.
        self.holds = [(meter, meter.hold(original)) for meter in active_meters()]

    def __del__(self) -> None:
        for meter, key in self.holds:
            if key is not None:
                meter.release(key)


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


def _user_saved_tensors_hooks() -> Any:
    """The (pack, unpack) pair a tensor saved right now would use, skipping checkpoint-internal
    hooks (ours and PyTorch's mark theirs the same way), or ``None``."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:  # pragma: no cover - older torch
        return None
    hooks = top(False)
    while hooks is not None and getattr(hooks[0], "_checkpoint_internal", False):
        hooks = getattr(hooks[0], "_user_hooks", None)
    return hooks


def _top_saved_tensors_hooks() -> Any:
    """The (pack, unpack) pair a tensor saved right now would use, or ``None``."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return None if top is None else top(False)


class _InternalHooks(torch.autograd.graph.saved_tensors_hooks):
    """A saved-tensor hook pair marked as belonging to a checkpoint, so that code looking for
    the *user's* hooks (selective checkpointing's cache, nested checkpoints) looks past it.

    ``_user_hooks`` only exists while the pair is active: the graph keeps the pack hook alive in
    a way the garbage collector cannot traverse, so a permanent attribute would let the graph
    pin the user's hooks (and whatever they reach) forever.
    """

    def __init__(self, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], Any]) -> None:
        pack._checkpoint_internal = True  # type: ignore[attr-defined]  # torch's marker on a function
        super().__init__(pack, unpack)

    def __enter__(self) -> None:
        self.pack_hook._user_hooks = _user_saved_tensors_hooks()
        super().__enter__()

    def __exit__(self, *exc: object) -> None:
        self.pack_hook.__dict__.pop("_user_hooks", None)
        super().__exit__(*exc)


def _metadata(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": t.device}


def _call_site() -> str:
    """The innermost stack frame outside torch and this module (only used with debug=True)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename != _THIS_FILE and "/torch/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def _current_gid() -> Any:
    """Which backward pass an unpack belongs to: the active ``GraphExecGroup`` if any, else the
    autograd graph task, else (unpacked outside any backward) a fresh id."""
    group = _current_graph_exec_group()
    if group is not None:
        return group
    gid = torch._C._current_graph_task_id()
    return next(_FRESH_IDS) if gid == -1 else gid


def _current_graph_exec_group() -> Any:
    probe = getattr(torch._C, "_get_graph_exec_group", None)
    return None if probe is None else probe()


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
        self.forward_log: OpLog | None = None
        self.recompute_log: OpLog | None = None
        # The (empty) output of _SaveInputs: it owns the node that owns the saved inputs. The
        # output, not its grad_fn, is kept: in torch before 2.12 or so the Python grad_fn of a
        # custom Function refers to its node weakly, so once the output died the node and its
        # saved inputs were freed and every backward failed ("Trying to backward through the
        # graph a second time"); torch.utils.checkpoint keeps the output too.
        self.input_saver: Any = None
        self.holders: list[weakref.ref[_Holder]] = []
        self.metadata: list[dict[str, Any]] = []
        self.sites: list[str] = []  # where each tensor was saved (debug only)
        self.forward_done = False
        # Per backward pass (graph task id or GraphExecGroup): recomputed tensors not yet
        # handed out, and the passes that already ran their recompute.
        self.recomputed: dict[Any, dict[int, Any]] = {}
        self.finished: set[Any] = set()
        self.lock = threading.RLock()
        # Inputs, boxed so they can be dropped once no saved tensor of this checkpoint is left
        # in the graph (see _holder_died): autograd never runs _SaveInputs' backward, so its
        # saved inputs would otherwise live as long as the whole graph.
        self.input_boxes: list[_InputBox] = []
        self.live_holders = 0

    def input_hooks(self, outer: tuple[Any, Any] | None) -> _InternalHooks:
        """Hooks for saving the inputs in _SaveInputs: box them (after ``outer``'s pack, the
        user's or offload's hooks, which a box must apply itself since only one pair runs)."""
        if outer is None:
            # Whatever pair is active now, an enclosing checkpoint's included: the inputs of an
            # inner checkpoint are saved tensors of its parent (PyTorch's nesting rule 2).
            outer = _top_saved_tensors_hooks()
        # The graph keeps this pack hook alive in the _SaveInputs node the frame points to:
        # a strong reference back to the frame would be a cycle the collector cannot see.
        boxes = self.input_boxes

        def pack(t: torch.Tensor) -> _InputBox:
            box = _InputBox(t, outer)
            boxes.append(box)
            return box

        def unpack(box: _InputBox) -> torch.Tensor:
            return box.get()

        return _InternalHooks(pack, unpack)

    def release_inputs_if_unused(self) -> None:
        """Drop the inputs once the forward is over and every saved tensor of this checkpoint
        has left the graph (backward consumed them without retain_graph, or the graph died)."""
        if self.forward_done and self.live_holders == 0:
            for box in self.input_boxes:
                box.release()

    def hooks(self) -> _InternalHooks:
        """The forward's hook pair. Closures, not bound methods: the pack hook must carry the
        attributes of :class:`_InternalHooks`."""

        def pack(t: torch.Tensor) -> _Holder:
            return self.pack(t)

        def unpack(holder: _Holder) -> torch.Tensor:
            return self.unpack(holder)

        return _InternalHooks(pack, unpack)

    # -- forward ---------------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> _Holder:
        holder = _Holder(len(self.holders))
        self.holders.append(weakref.ref(holder, _holder_died_callback(self)))
        self.live_holders += 1
        if self.check_metadata:
            self.metadata.append(_metadata(t))
        if self.debug:
            self.sites.append(_call_site())
        return holder

    # -- backward --------------------------------------------------------------------------
    def unpack(self, holder: _Holder) -> torch.Tensor:
        gid = _current_gid()
        with self.lock:
            if gid not in self.finished:
                self.recomputed[gid] = self._recompute_reporting(gid)
                self.finished.add(gid)
            store = self.recomputed.get(gid, {})
            tensor = store.pop(holder.index, None)
            if isinstance(tensor, _Kept):
                tensor = tensor.tensor
            if not store:
                self.recomputed.pop(gid, None)
        if tensor is None:
            extra = GRAPH_EXEC_GROUP_OVERLAP if _current_graph_exec_group() is not None else ""
            raise ActivationCheckpointError(
                "shardpoint.activation: " + UNPACKED_TWICE.format(extra=extra)
            )
        return tensor

    def _recompute_reporting(self, gid: Any) -> dict[int, Any]:
        if not _TIMERS:
            return self._recompute_checked(gid)
        depth = getattr(_NESTING, "depth", 0)
        _NESTING.depth = depth + 1
        start = time.perf_counter()
        try:
            return self._recompute_checked(gid)
        finally:
            _NESTING.depth = depth
            if depth == 0:  # outermost recompute: nested ones are inside its time
                elapsed = time.perf_counter() - start
                for timer in _TIMERS:
                    timer.seconds += elapsed
                    timer.count += 1

    def _recompute_checked(self, gid: Any) -> dict[int, Any]:
        try:
            return self._recompute(gid)
        except RecomputeMismatchError as exc:
            if not self.debug:
                raise
            raise RecomputeMismatchError(
                format_debug_report(str(exc), self.forward_log, self.recompute_log)
            ) from exc

    def _recompute(self, gid: Any) -> dict[int, Any]:
        # raises if an input was modified in place
        saved = iter(self.input_saver.grad_fn.saved_tensors)
        args = fill_tensors(self.args, saved)
        kwargs = fill_tensors(self.kwargs, saved)
        # Autograd run inside the still-running forward (torch.autograd.grad in the function)
        # may need a tensor saved so far: recompute up to there; the rest does not exist yet.
        forward_done = self.forward_done
        expected = len(self.holders)
        store: dict[int, Any] = {}
        recomputed_meta: list[dict[str, Any]] = []
        recomputed_sites: list[str] = []
        state = {"count": 0, "extra": False}
        # The recompute graph keeps this hook alive where the collector cannot see it: reach the
        # frame weakly so that graph never pins the frame (and through it the inputs).
        frame_ref = weakref.ref(self)

        def pack(t: torch.Tensor) -> torch.Tensor:
            frame = frame_ref()
            if frame is None:  # pragma: no cover - the frame runs this very recompute
                raise AssertionError("shardpoint.activation: recompute without its frame")
            # Detached: the recompute graph stores what this hook returns, and a tensor that
            # still carries its own grad_fn would form a C++ reference cycle (node -> saved
            # tensor -> node) that Python's collector cannot see, keeping the frame alive.
            original = t
            t = t.detach() if t.requires_grad else t
            index = state["count"]
            state["count"] += 1
            if index >= expected:
                if not forward_done:
                    # Early stop is off and the forward is still running: later tensors were
                    # not saved by the forward yet; let the function run on.
                    state["extra"] = True
                    return t
                raise RecomputeMismatchError(
                    "shardpoint.activation: trying to save more tensors during recomputation "
                    f"than during the original forward pass ({expected})." + DEBUG_TIP
                )
            holder = frame.holders[index]()
            if holder is not None:  # dead when that part of the graph was already freed
                store[index] = _Kept(t, original) if active_meters() else t
            if frame.check_metadata:
                recomputed_meta.append(_metadata(t))
            if frame.debug:
                recomputed_sites.append(_call_site())
            if frame.early_stop and state["count"] == expected:
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
            if self.debug:
                self.recompute_log = OpLog()
                stack.enter_context(self.recompute_log)
            stack.enter_context(_InternalHooks(pack, unpack))
            stack.enter_context(torch.enable_grad())
            try:
                self.fn(*args, **kwargs)
            except _StopRecompute:
                pass

        count = state["count"]
        if state["extra"]:
            return store
        if count != expected:
            raise RecomputeMismatchError(
                "shardpoint.activation: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {expected}\n"
                f"Number of tensors saved during recomputation: {count}." + DEBUG_TIP
            )
        if self.check_metadata:
            self._check_metadata(recomputed_meta, recomputed_sites)
        return store

    def _check_metadata(self, recomputed: list[dict[str, Any]], sites: list[str]) -> None:
        lines = []
        for i, (before, after) in enumerate(zip(self.metadata, recomputed, strict=False)):
            if before != after:
                lines.append(
                    f"tensor at position {i}:\nsaved metadata: {before}\n"
                    f"recomputed metadata: {after}"
                )
                if self.debug:
                    lines.append(f"  saved at: {self.sites[i]}\n  recomputed at: {sites[i]}")
        if lines:
            raise RecomputeMismatchError(
                "shardpoint.activation: Recomputed values for the following tensors have "
                "different metadata than during the forward pass.\n"
                + "\n".join(lines)
                + "\n(metadata: shape, dtype, device)"
                + DEBUG_TIP
            )


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
    input_hooks: tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]] | None = None,
) -> Any:
    """Run ``fn(*args, **kwargs)`` so that its activations are recomputed during backward.

    ``input_hooks``, if given, is a saved-tensor hook pair applied to the inputs the checkpoint
    keeps (offload to host memory or disk, see :mod:`._offload`)."""
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
    with frame.input_hooks(input_hooks):
        frame.input_saver = _SaveInputs.apply(dummy, *tensors)

    suppressed = True
    with contextlib.ExitStack() as stack:
        if forward_ctx is not None:
            stack.enter_context(forward_ctx)
        if debug:
            frame.forward_log = OpLog()
            stack.enter_context(frame.forward_log)
        stack.enter_context(frame.hooks())
        output = fn(*args, **kwargs)
        suppressed = False
    if suppressed:
        # A context from context_fn swallowed the function's exception: there is no output.
        raise ActivationCheckpointError(
            "shardpoint.activation: the forward context provided by context_fn suppressed an "
            "exception raised during the checkpointed forward; checkpoint cannot return a "
            "value for a failed forward."
        )
    frame.forward_done = True
    frame.release_inputs_if_unused()  # nothing saved: the inputs are never needed
    if rng is not None:
        rng.check_no_new_runtime()
    return output
