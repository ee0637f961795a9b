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

from collections.abc import Callable
from typing import Any

from torch.utils.checkpoint import GraphExecGroup as _TorchGraphExecGroup

from ._common import (
    ActivationCheckpointError,
    RecomputeMismatchError,
    debug_override,
    early_stop_override,
    set_checkpoint_debug_enabled,
    set_checkpoint_early_stop,
)
from ._nonreentrant import checkpoint_nonreentrant
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
        **kwargs: keyword arguments for ``function`` (non-reentrant only).

    Returns:
        Whatever ``function`` returns.

    Raises:
        RecomputeMismatchError: the recompute saved different tensors than the forward.
        ActivationCheckpointError: a limit of the chosen variant was hit (e.g. ``autograd.grad``
            with ``use_reentrant=True``). Both are ``RuntimeError`` and
            ``shardpoint.errors.CheckpointError`` subclasses.
        ValueError: invalid option, or an argument the reentrant variant cannot handle.
    """
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(
            f"determinism_check should be one of {list(_DETERMINISM_CHECKS)}, "
            f"but got {determinism_check}"
        )
    debug_forced = debug_override()
    if debug_forced is not None and not use_reentrant:
        debug = debug_forced
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
    return checkpoint_nonreentrant(
        function,
        args,
        kwargs,
        preserve_rng_state=preserve_rng_state,
        context_fn=context_fn,
        check_metadata=determinism_check == "default",
        early_stop=early_stop if override is None else override,
        debug=debug,
    )


def checkpoint_sequential(
    functions: torch.nn.Sequential | list[Callable[[Any], Any]],
    segments: int | str,
    input: Any,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    **kwargs: Any,
) -> Any:
    """Run a sequence of functions, checkpointing all chunks but the last.

    ``functions`` (an ``nn.Sequential`` or a list of modules/functions) is cut as PyTorch does:
    ``segments - 1`` chunks of ``len(functions) // segments`` functions, each run through
    :func:`checkpoint`, then the remaining functions run normally (their activations are
    needed first in backward, so recomputing them would save nothing).

    Args:
        functions: the model, applied as ``f_n(...f_2(f_1(input)))``.
        segments: number of chunks, ``1 <= segments <= len(functions)``, or ``"auto"`` for the
            count minimizing peak activation memory (:func:`auto_segments`, about
            ``sqrt(len(functions))``).
        input: the input of the first function.
        use_reentrant: variant used for the chunks, see :func:`checkpoint`.
        preserve_rng_state: see :func:`checkpoint`.

    Raises:
        ValueError: ``segments`` out of range, or an unexpected keyword argument.
        TypeError: ``segments`` or ``functions`` of the wrong type.
    """
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    fns = as_function_list(functions)
    count = resolve_segments(len(fns), segments)
    value = input
    bounds = split_points(len(fns), count)
    for start, stop in bounds[:-1]:
        value = checkpoint(
            run_range(fns, start, stop),
            value,
            use_reentrant=use_reentrant,
            preserve_rng_state=preserve_rng_state,
        )
    start, stop = bounds[-1]
    return run_range(fns, start, stop)(value)
