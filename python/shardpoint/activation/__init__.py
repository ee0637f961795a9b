"""Activation checkpointing for PyTorch: trade compute for memory by recomputing activations.

``checkpoint(fn, *args)`` runs ``fn`` without keeping its intermediate activations for backward
and recomputes them when backward needs them; ``checkpoint_sequential`` does the same for
chunks of a sequential model. Two variants, chosen by ``use_reentrant``:

* ``use_reentrant=False`` (default): saved-tensor hooks. Works with ``torch.autograd.grad``,
  ``backward(inputs=...)``, keyword arguments, inputs that do not require grad, nested and
  non-tensor outputs; stops recomputing early; checks the recomputed tensors.
* ``use_reentrant=True``: an autograd Function whose backward re-runs the function and calls a
  nested backward. Only ``.backward()`` without ``inputs``; only top-level tensor arguments.

See docs/ACTIVATION.md for when to use which, RNG semantics and the differences from
``torch.utils.checkpoint``. This module needs PyTorch (``pip install shardpoint[torch]``).
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "shardpoint.activation requires PyTorch, which is an optional dependency of shardpoint; "
        "install it with `pip install shardpoint[torch]`"
    ) from exc

import statistics
import time
from collections.abc import Callable
from typing import Any

from torch.utils.checkpoint import GraphExecGroup as _TorchGraphExecGroup

from ._common import (
    ActivationCheckpointError,
    RecomputeMismatchError,
    debug_override,
    early_stop_override,
    iter_tensors,
    set_checkpoint_debug_enabled,
    set_checkpoint_early_stop,
)
from ._memory import ActivationMemoryMeter
from ._nonreentrant import checkpoint_nonreentrant
from ._offload import OFFLOAD_KINDS, OffloadSession
from ._offload_codec import OFFLOAD_COMPRESSIONS
from ._planner import BudgetTooSmallError, Plan, run_plan, solve
from ._policy import policy_context_fn
from ._profile import LayerProfile, profile_chain
from ._reentrant import checkpoint_reentrant
from ._sequential import (
    as_function_list,
    auto_segments,
    resolve_segments,
    run_range,
    segment_cost,
    split_points,
)

__all__ = [
    "ActivationCheckpointError",
    "ActivationMemoryMeter",
    "BudgetTooSmallError",
    "CheckpointedSequential",
    "LayerProfile",
    "Plan",
    "plan",
    "profile_chain",
    "RecomputeMismatchError",
    "auto_segments",
    "checkpoint",
    "checkpoint_sequential",
    "segment_cost",
    "set_checkpoint_debug_enabled",
    "set_checkpoint_early_stop",
    "split_points",
    "GraphExecGroup",
]

_DETERMINISM_CHECKS = ("default", "none")

#: PyTorch's context manager, re-exported: backward calls under one instance recompute each
#: checkpointed region at most once (non-reentrant checkpoints of both libraries honour it).
GraphExecGroup = _TorchGraphExecGroup


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    context_fn: Callable[[], tuple[Any, Any]] | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    policy: Any = None,
    offload: str | None = None,
    offload_dir: str | None = None,
    offload_compression: str = "auto",
    **kwargs: Any,
) -> Any:
    """Run ``function(*args, **kwargs)`` without keeping its activations; recompute them in
    backward.

    Args:
        function: the segment to run. Called once now and (at most) once per backward.
        *args: its positional arguments: tensors, nested lists/tuples/dicts of tensors
            (non-reentrant only) and any other objects, passed through unchanged.
        use_reentrant: ``False`` (default) for the saved-tensor-hook variant, ``True`` for the
            autograd-Function variant (see the module docstring for their limits).
        preserve_rng_state: stash the torch CPU RNG, the RNG of the current CUDA device and of
            every accelerator device holding a tensor argument, numpy's global RNG and Python's
            ``random`` before the forward, and replay them around the recompute, so dropout and
            other random ops draw the same numbers. ``False`` skips that (cheaper; random ops
            then draw new numbers during the recompute and advance the global streams).
        context_fn: non-reentrant only; returns two context managers, entered around the
            forward and around the recompute respectively.
        determinism_check: ``"default"`` compares shape, dtype and device of every tensor the
            recompute saves with the forward's (non-reentrant only); ``"none"`` skips it.
        debug: non-reentrant only; mismatch errors name the source line that saved each tensor.
        early_stop: non-reentrant only; stop the recompute once every tensor saved during
            forward exists again (default). An active :func:`set_checkpoint_early_stop` wins.
            The reentrant variant always re-runs the whole function.
        policy: non-reentrant only; selective checkpointing in one argument: ``"matmul"``
            (keep matmul/convolution/attention outputs, recompute the rest), a list of ops to
            keep, or a policy callable as PyTorch's. Shorthand for ``context_fn`` built with
            ``create_selective_checkpoint_contexts``; cannot be combined with ``context_fn``.
        offload: non-reentrant only; ``"cpu"`` or ``"disk"``: the inputs this checkpoint keeps
            for its recompute go to host memory or through shardpoint's store to a scratch
            directory until backward needs them, as with :func:`checkpoint_sequential`
            (docs/ACTIVATION.md, Offload). Memory is only saved for inputs nothing else
            keeps alive.
        offload_dir: root of the scratch directories of ``offload="disk"``.
        offload_compression: ``"auto"``, ``"none"`` or a codec name, as for
            :func:`checkpoint_sequential` (``offload="disk"`` only).
        **kwargs: keyword arguments for ``function`` (non-reentrant only). ``policy``,
            ``offload``, ``offload_dir``, ``offload_compression`` and the other parameters
            above are this function's own.

    Returns:
        Whatever ``function`` returns.

    Raises:
        RecomputeMismatchError: the recompute saved different tensors than the forward.
        ActivationCheckpointError: a limit of the chosen variant was hit (e.g. ``autograd.grad``
            with ``use_reentrant=True``). Both are ``RuntimeError`` and
            ``shardpoint.errors.CheckpointError`` subclasses.
        ValueError: invalid option, or an argument the reentrant variant cannot handle.
    """
    _check_offload_options(offload, offload_compression)
    if offload is not None and use_reentrant:
        raise ValueError("offload is only supported with use_reentrant=False")
    if not torch.is_grad_enabled():
        offload = None  # nothing is kept for backward: no scratch session to open
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(
            f"determinism_check should be one of {list(_DETERMINISM_CHECKS)}, "
            f"but got {determinism_check}"
        )
    debug_forced = debug_override()
    if debug_forced is not None and not use_reentrant:
        debug = debug_forced
    if policy is not None:
        if context_fn is not None:
            raise ValueError("pass either policy= or context_fn=, not both")
        if use_reentrant:
            raise ValueError("policy= is only supported when use_reentrant=False.")
        context_fn = policy_context_fn(policy)
    if use_reentrant:
        if context_fn is not None or debug:
            raise ValueError(
                "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
            )
        if kwargs:
            raise ValueError(
                "Unexpected keyword arguments: " + ",".join(kwargs) + ". With use_reentrant=True "
                "the function only receives positional arguments; bind keywords with "
                "functools.partial or use use_reentrant=False."
            )
        return checkpoint_reentrant(function, args, preserve_rng_state=preserve_rng_state)
    override = early_stop_override()

    def run(hooks: Any) -> Any:
        return checkpoint_nonreentrant(
            function,
            args,
            kwargs,
            preserve_rng_state=preserve_rng_state,
            context_fn=context_fn,
            check_metadata=determinism_check == "default",
            early_stop=early_stop if override is None else override,
            debug=debug,
            input_hooks=hooks,
        )

    return _run_offloaded(offload, offload_dir, offload_compression, run)


def _checkpoint_piece(
    fn: Callable[[Any], Any],
    value: Any,
    *,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    input_hooks: Any = None,
) -> Any:
    """One checkpointed chunk of a sequential run (offload hooks apply to its input)."""
    if use_reentrant or input_hooks is None:
        return checkpoint(
            fn, value, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state
        )
    override = early_stop_override()
    debug_forced = debug_override()
    return checkpoint_nonreentrant(
        fn,
        (value,),
        {},
        preserve_rng_state=preserve_rng_state,
        context_fn=None,
        check_metadata=True,
        early_stop=True if override is None else override,
        debug=bool(debug_forced),
        input_hooks=input_hooks,
    )


def plan(
    functions: torch.nn.Sequential | list[Callable[[Any], Any]],
    sample_input: Any,
    memory_budget: int,
    *,
    offload: str | None = None,
    repeats: int = 3,
) -> Plan:
    """Profile ``functions`` on ``sample_input`` and solve for the schedule with the least
    recomputation whose peak saved-activation memory fits ``memory_budget`` bytes.

    Each layer is run ``repeats + 1`` times for real (saved bytes, input bytes and forward
    time measured; random state and module buffers are put back afterwards). The solver is a
    dynamic program over the chain in the spirit of Rotor (heterogeneous layers; checkpointed
    pieces may themselves be re-run with nested checkpoints); docs/ACTIVATION.md describes its
    memory and time model and what it ignores. ``print(plan)`` shows the table.

    Args:
        functions: an ``nn.Sequential`` or a list of modules/functions.
        sample_input: an input of the size the plan is for.
        memory_budget: bytes of saved activations allowed at any moment (see
            :class:`ActivationMemoryMeter` for what is counted).
        offload: ``"cpu"`` or ``"disk"``: the inputs kept by top-level checkpoints go there and
            do not count against the budget (the largest is reserved for read-ahead).

    Raises:
        BudgetTooSmallError: (a ``ValueError``) below the minimum any schedule needs; the
            message and its ``minimum`` attribute give it in bytes.
    """
    if offload is not None and offload not in OFFLOAD_KINDS:
        raise ValueError(f"offload must be one of {list(OFFLOAD_KINDS)} or None, got {offload!r}")
    fns = as_function_list(functions)
    if not fns:
        raise ValueError("plan needs at least one function")
    profiles = profile_chain(fns, sample_input, repeats=repeats)
    return solve(profiles, memory_budget, offload=offload, overhead_seconds=checkpoint_overhead())


_OVERHEAD: list[float] = []


def checkpoint_overhead() -> float:
    """Fixed cost (seconds) of one non-reentrant checkpoint, forward and backward, measured
    once per process on a one-element function (bookkeeping, RNG stash and replay)."""
    if not _OVERHEAD:
        x = torch.zeros(1, requires_grad=True)
        samples = []
        for _ in range(7):
            start = time.perf_counter()
            checkpoint(torch.sin, x).backward()
            samples.append(time.perf_counter() - start)
        plain = []
        for _ in range(7):
            start = time.perf_counter()
            torch.sin(x).backward()
            plain.append(time.perf_counter() - start)
        _OVERHEAD.append(max(statistics.median(samples) - statistics.median(plain), 0.0))
    return _OVERHEAD[0]


# Plans reused by checkpoint_sequential(segments="budget"): keyed by the identity of the
# functions, the input's signature, the budget and offload; the functions are held weakly where
# possible so a recycled id never matches a dead model.
_PLAN_CACHE: dict[tuple[Any, ...], tuple[list[Any], Plan]] = {}
_PLAN_CACHE_SIZE = 16


def _signature(value: Any) -> tuple[Any, ...]:
    return tuple((tuple(t.shape), t.dtype, str(t.device)) for t in iter_tensors(value))


def _cached_plan(
    fns: list[Callable[[Any], Any]], value: Any, memory_budget: int, offload: str | None
) -> Plan:
    key = (tuple(id(f) for f in fns), _signature(value), memory_budget, offload)
    hit = _PLAN_CACHE.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], fns, strict=True)):
        return hit[1]
    result = plan(fns, value, memory_budget, offload=offload)
    if len(_PLAN_CACHE) >= _PLAN_CACHE_SIZE:
        _PLAN_CACHE.pop(next(iter(_PLAN_CACHE)))
    _PLAN_CACHE[key] = (list(fns), result)
    return result


def _check_offload_options(offload: str | None, compression: str) -> None:
    if offload is not None and offload not in OFFLOAD_KINDS:
        raise ValueError(f"offload must be one of {list(OFFLOAD_KINDS)} or None, got {offload!r}")
    if compression not in OFFLOAD_COMPRESSIONS:
        raise ValueError(
            f"offload_compression must be one of {list(OFFLOAD_COMPRESSIONS)}, got {compression!r}"
        )
    if compression not in ("auto", "none") and offload != "disk":
        raise ValueError(
            f"offload_compression={compression!r} applies to offload='disk' only, got "
            f"offload={offload!r}"
        )


def _run_offloaded(
    offload: str | None, offload_dir: Any, compression: str, body: Callable[[Any], Any]
) -> Any:
    """Run ``body(input_hooks)`` inside an offload session (or without one)."""
    if offload is None:
        return body(None)
    session = OffloadSession(offload, directory=offload_dir, compression=compression)
    try:
        output = body(session.hooks())
    except BaseException:
        session.close()  # nothing will read the files back
        raise
    session.watch(output)
    return output


def checkpoint_sequential(
    functions: torch.nn.Sequential | list[Callable[[Any], Any]],
    segments: int | str | Plan,
    input: Any,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    *,
    memory_budget: int | None = None,
    offload: str | None = None,
    offload_dir: str | None = None,
    offload_compression: str = "auto",
    **kwargs: Any,
) -> Any:
    """Run a sequence of functions, checkpointing all chunks but the last.

    ``functions`` (an ``nn.Sequential`` or a list of modules/functions) is cut as PyTorch does:
    ``segments - 1`` chunks of ``len(functions) // segments`` functions, each run through
    :func:`checkpoint`, then the remaining functions run normally (their activations are
    needed first in backward, so recomputing them would save nothing).

    Args:
        functions: the model, applied as ``f_n(...f_2(f_1(input)))``.
        segments: number of chunks, ``1 <= segments <= len(functions)``; ``"auto"`` for the
            count minimizing modelled peak memory (:func:`auto_segments`, about
            ``sqrt(len(functions))``); ``"budget"`` to run the plan of :func:`plan` for
            ``memory_budget`` (profiled on this input the first time, then cached for inputs
            of the same shapes); or a :class:`Plan`.
        input: the input of the first function.
        use_reentrant: variant used for the chunks, see :func:`checkpoint` (the planner and
            offload need the default, ``False``).
        preserve_rng_state: see :func:`checkpoint`.
        memory_budget: bytes, with ``segments="budget"``.
        offload: ``"cpu"`` or ``"disk"``: the inputs the checkpoints keep go to host memory or
            through shardpoint's store to a scratch directory (``offload_dir``), and are read
            back ahead of backward. See docs/ACTIVATION.md.
        offload_dir: root of the scratch directories of ``offload="disk"``.
        offload_compression: how ``offload="disk"`` writes: ``"auto"`` (default) compresses
            with the store's default codec when that is modelled faster than writing raw on
            this disk (throughputs measured once per process; docs/ACTIVATION.md), ``"none"``
            writes raw, a codec name (``"zstd"``, ``"bytegroup-huffman"``, ...) always uses it.

    Raises:
        ValueError: ``segments`` out of range, a bad budget (:class:`BudgetTooSmallError`
            states the minimum), or an unexpected keyword argument.
        TypeError: ``segments`` or ``functions`` of the wrong type.
    """
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    fns = as_function_list(functions)
    _check_offload_options(offload, offload_compression)
    if offload is not None and use_reentrant:
        raise ValueError("offload is only supported with use_reentrant=False")
    if isinstance(segments, str) and segments == "budget" or isinstance(segments, Plan):
        if use_reentrant:
            raise ValueError("segments='budget' is only supported with use_reentrant=False")
        if isinstance(segments, Plan):
            chosen = segments
        else:
            if memory_budget is None:
                raise ValueError("segments='budget' needs memory_budget=<bytes>")
            if not torch.is_grad_enabled():
                return run_range(fns, 0, len(fns))(input)
            chosen = _cached_plan(fns, input, memory_budget, offload)

        def planned(hooks: Any) -> Any:
            def piece(fn: Callable[[Any], Any], value: Any, **kw: Any) -> Any:
                return _checkpoint_piece(
                    fn, value, preserve_rng_state=preserve_rng_state, input_hooks=kw.get("hooks")
                )

            top = {"hooks": hooks} if hooks is not None else {}
            return run_plan(chosen, fns, input, piece, top)

        return _run_offloaded(offload, offload_dir, offload_compression, planned)
    if memory_budget is not None:
        raise ValueError("memory_budget is only used with segments='budget'")
    count = resolve_segments(len(fns), segments)
    bounds = split_points(len(fns), count)

    def split(hooks: Any) -> Any:
        value = input
        for start, stop in bounds[:-1]:
            value = _checkpoint_piece(
                run_range(fns, start, stop),
                value,
                use_reentrant=use_reentrant,
                preserve_rng_state=preserve_rng_state,
                input_hooks=hooks,
            )
        start, stop = bounds[-1]
        return run_range(fns, start, stop)(value)

    return _run_offloaded(offload, offload_dir, offload_compression, split)


class CheckpointedSequential(torch.nn.Module):
    """``module`` (an ``nn.Sequential``) run under a memory budget: in training with grad
    enabled, each forward follows the plan of :func:`plan` for that input's shapes (profiled
    once per shape, then cached; ``.last_plan`` is the plan used last); otherwise it runs the
    module as it is.

    Example::

        model = CheckpointedSequential(nn.Sequential(*blocks), memory_budget=2 << 30)
        loss = model(x).sum(); loss.backward()
        print(model.last_plan)

    ``offload``, ``offload_dir`` and ``offload_compression`` are as for
    :func:`checkpoint_sequential`.
    """

    def __init__(
        self,
        module: torch.nn.Sequential,
        memory_budget: int,
        *,
        offload: str | None = None,
        offload_dir: str | None = None,
        offload_compression: str = "auto",
        preserve_rng_state: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(module, torch.nn.Sequential):
            raise TypeError(
                f"CheckpointedSequential wraps a torch.nn.Sequential, got {type(module).__name__}"
            )
        _check_offload_options(offload, offload_compression)
        self.module = module
        self.memory_budget = int(memory_budget)
        self.offload = offload
        self.offload_dir = offload_dir
        self.offload_compression = offload_compression
        self.preserve_rng_state = preserve_rng_state
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self.last_plan: Plan | None = None

    def forward(self, input: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return self.module(input)
        key = _signature(input)
        chosen = self._plans.get(key)
        if chosen is None:
            chosen = plan(self.module, input, self.memory_budget, offload=self.offload)
            self._plans[key] = chosen
        self.last_plan = chosen
        return checkpoint_sequential(
            self.module,
            chosen,
            input,
            preserve_rng_state=self.preserve_rng_state,
            offload=self.offload,
            offload_dir=self.offload_dir,
            offload_compression=self.offload_compression,
        )
