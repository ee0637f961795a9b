"""Per-layer measurements of a sequential model, the input of the memory-budget planner.

Each layer is run for real (grad enabled, as in training) under a saved-tensor hook that
records the storages autograd keeps for its backward. Measured per layer ``i`` (input
``x_i``, output ``x_{i+1}``):

* ``saved_bytes``: distinct storages layer ``i`` alone saves for backward (its input, its
  output, intermediates), parameters excluded;
* ``input_bytes``: the storages of ``x_i``, what a checkpoint starting at layer ``i`` keeps;
* ``forward_seconds``: shortest wall time of the layer's forward over the timed runs.

Profiling leaves no trace: random generators are put back (dropout draws the same numbers
afterwards as without profiling), module buffers (BatchNorm statistics) restored, and no
gradient is computed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._common import iter_tensors
from ._memory import is_parameter_like, storage_bytes
from ._state import RngSnapshot

__all__ = ["LayerProfile", "profile_chain"]


@dataclass(frozen=True)
class LayerProfile:
    """Measurements of one layer of the chain (see the module docstring)."""

    index: int
    name: str
    input_bytes: int
    saved_bytes: int
    output_bytes: int
    forward_seconds: float
    #: of ``saved_bytes``, the storages of the layer's input (``x_i``) and of its output
    #: (``x_{i+1}``): the planner counts a storage once when neighbours share it
    saved_input_bytes: int = 0
    saved_output_bytes: int = 0


def _name(fn: Callable[..., Any], index: int) -> str:
    if isinstance(fn, torch.nn.Module):
        return f"{index}:{type(fn).__name__}"
    return f"{index}:{getattr(fn, '__name__', type(fn).__name__)}"


@contextlib.contextmanager
def _buffers_restored(functions: Sequence[Callable[..., Any]]) -> Iterator[None]:
    saved = []
    for fn in functions:
        if isinstance(fn, torch.nn.Module):
            for buf in fn.buffers():
                saved.append((buf, buf.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def _key_of(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _keys(tensors: Any) -> set[tuple[str, int]]:
    return {_key_of(t) for t in tensors}


def _sync(value: Any) -> None:
    for t in iter_tensors(value):
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)
            return


def profile_chain(
    functions: Sequence[Callable[[Any], Any]], sample_input: Any, *, repeats: int = 3
) -> list[LayerProfile]:
    """Measure every layer of ``functions`` on ``sample_input`` (see the module docstring).

    Runs the chain ``repeats + 1`` times (the first run warms up and is not timed).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    n = len(functions)
    times: list[list[float]] = [[] for _ in range(n)]
    saved: list[int] = [0] * n
    saved_in: list[int] = [0] * n
    saved_out: list[int] = [0] * n
    inputs: list[int] = [0] * n
    outputs: list[int] = [0] * n
    rng = RngSnapshot((sample_input,))
    with rng.replay(), _buffers_restored(functions), torch.enable_grad():
        for run in range(repeats + 1):
            value = sample_input
            for i, fn in enumerate(functions):
                kept: list[torch.Tensor] = []

                def pack(t: torch.Tensor, kept: list[torch.Tensor] = kept) -> torch.Tensor:
                    if not is_parameter_like(t):
                        kept.append(t)
                    return t

                if run == 0:
                    inputs[i] = storage_bytes(iter_tensors(value))
                    input_keys = _keys(iter_tensors(value))
                _sync(value)
                start = time.perf_counter()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    value = fn(value)
                _sync(value)
                elapsed = time.perf_counter() - start
                if run == 0:
                    saved[i] = storage_bytes(kept)
                    outputs[i] = storage_bytes(iter_tensors(value))
                    output_keys = _keys(iter_tensors(value))
                    saved_in[i] = storage_bytes(t for t in kept if _key_of(t) in input_keys)
                    saved_out[i] = storage_bytes(
                        t
                        for t in kept
                        if _key_of(t) in output_keys and _key_of(t) not in input_keys
                    )
                else:
                    times[i].append(elapsed)
            del value
    return [
        LayerProfile(
            index=i,
            name=_name(functions[i], i),
            input_bytes=inputs[i],
            saved_bytes=saved[i],
            output_bytes=outputs[i],
            forward_seconds=min(times[i]),  # the least disturbed run: load only adds time
            saved_input_bytes=saved_in[i],
            saved_output_bytes=saved_out[i],
        )
        for i in range(n)
    ]
