"""``checkpoint_sequential`` and the ``"auto"`` segment rule."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "as_function_list",
    "auto_segments",
    "resolve_segments",
    "run_range",
    "segment_cost",
    "split_points",
]


def as_function_list(functions: Any) -> list[Callable[[Any], Any]]:
    """The children of an ``nn.Sequential``, or the items of a list/tuple of callables."""
    if isinstance(functions, torch.nn.Sequential):
        return list(functions.children())
    if isinstance(functions, (list, tuple, torch.nn.ModuleList)):
        fns = list(functions)
    else:
        raise TypeError(
            "checkpoint_sequential: functions must be a torch.nn.Sequential or a list of "
            f"modules/functions, got {type(functions).__name__}"
        )
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(f"checkpoint_sequential: functions[{i}] is not callable: {fn!r}")
    return fns


def split_points(num_functions: int, segments: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges of the segments, PyTorch's rule: ``segments - 1`` chunks of
    ``num_functions // segments`` functions, then one last chunk with all the rest."""
    _check_segments(num_functions, segments)
    size = num_functions // segments
    bounds = [(i * size, (i + 1) * size) for i in range(segments - 1)]
    bounds.append(((segments - 1) * size, num_functions))
    return bounds


def _check_segments(num_functions: int, segments: int) -> None:
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise TypeError(f"segments must be an int or 'auto', got {segments!r}")
    if num_functions < 1:
        raise ValueError("checkpoint_sequential needs at least one function")
    if segments < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")
    if segments > num_functions:
        raise ValueError(
            f"segments ({segments}) must not exceed the number of functions ({num_functions}): "
            "every segment needs at least one function"
        )


def segment_cost(
    num_functions: int,
    segments: int,
    per_function: float = 2.0,
    per_boundary: float = 1.0,
) -> float:
    """Modelled peak of saved activations for ``segments`` segments under :func:`split_points`.

    Every function is assumed to save ``per_function`` units for backward and every
    checkpointed segment keeps its input (``per_boundary`` units). The peak is reached either at
    the end of forward (the inputs of the ``segments - 1`` checkpointed chunks plus everything
    the last, uncheckpointed chunk saves) or while one checkpointed chunk is recomputed during
    backward (the chunk inputs still alive plus that chunk's activations); both terms share the
    boundaries, hence ``(segments - 1) * per_boundary + max(last, size) * per_function``.
    """
    bounds = split_points(num_functions, segments)
    if segments == 1:
        return num_functions * per_function
    size = bounds[0][1] - bounds[0][0]
    last = bounds[-1][1] - bounds[-1][0]
    return (segments - 1) * per_boundary + max(last, size) * per_function


def auto_segments(num_functions: int, per_function: float = 2.0, per_boundary: float = 1.0) -> int:
    """The segment count minimizing :func:`segment_cost` (Chen et al. 2016, "Training Deep
    Nets with Sublinear Memory Cost").

    The default costs say that a function saves about twice what a chunk boundary keeps (its
    input plus one more tensor: Linear+ReLU, a residual block); pass measured costs if known.
    With uniform costs the optimum is near ``sqrt(num_functions * per_function /
    per_boundary)``; the search is exact because PyTorch's split puts the remainder in the
    last chunk, which shifts the optimum (32 functions, default costs: 8 segments of 4, not 5 or 6). Ties go
    to the count that recomputes fewer functions.
    """
    if isinstance(num_functions, bool) or not isinstance(num_functions, int):
        raise TypeError(f"num_functions must be an int, got {num_functions!r}")
    if num_functions < 1:
        raise ValueError("auto_segments needs at least one function")
    if not (per_function > 0 and per_boundary > 0 and math.isfinite(per_function + per_boundary)):
        raise ValueError("per_function and per_boundary must be positive and finite")

    def key(k: int) -> tuple[float, int]:
        recomputed = (k - 1) * (num_functions // k)
        return (segment_cost(num_functions, k, per_function, per_boundary), recomputed)

    return min(range(1, num_functions + 1), key=key)


def resolve_segments(num_functions: int, segments: int | str) -> int:
    """Turn ``segments`` (an int or ``"auto"``) into a validated segment count."""
    if isinstance(segments, str):
        if segments != "auto":
            raise ValueError(f"segments must be an int or 'auto', got {segments!r}")
        if num_functions < 1:
            raise ValueError("checkpoint_sequential needs at least one function")
        return auto_segments(num_functions)
    _check_segments(num_functions, segments)
    return segments


def run_range(functions: Sequence[Callable[[Any], Any]], start: int, stop: int) -> Callable:
    """A function applying ``functions[start:stop]`` in order."""

    def forward(value: Any) -> Any:
        for fn in functions[start:stop]:
            value = fn(value)
        return value

    return forward
