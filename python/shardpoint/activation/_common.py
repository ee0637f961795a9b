"""Errors, nested-structure helpers and global switches shared by both checkpoint variants."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as _torch_checkpoint
from torch.utils.checkpoint import CheckpointError as _TorchCheckpointError

from shardpoint.errors import CheckpointError

__all__ = [
    "ActivationCheckpointError",
    "RecomputeMismatchError",
    "set_checkpoint_early_stop",
    "early_stop_override",
    "set_checkpoint_debug_enabled",
    "debug_override",
    "iter_tensors",
    "blank_tensors",
    "fill_tensors",
    "SLOT",
]


class ActivationCheckpointError(CheckpointError, _TorchCheckpointError):
    """Activation checkpointing was used in a way it cannot support.

    It is also a ``torch.utils.checkpoint.CheckpointError`` (a :class:`RuntimeError`), so
    ``except`` clauses written for ``torch.utils.checkpoint`` keep catching it.
    """


class RecomputeMismatchError(ActivationCheckpointError):
    """The recomputation during backward did not reproduce the tensors saved during forward
    (different count, shape, dtype or device), so the gradients would be wrong."""


# Set by ``set_checkpoint_early_stop``; ``None`` means "use the default (True)". It is read when
# a checkpointed forward runs, like PyTorch's switch of the same name, not when backward runs.
_EARLY_STOP: bool | None = None


@contextlib.contextmanager
def set_checkpoint_early_stop(enable: bool) -> Iterator[None]:
    """Within this block, non-reentrant checkpoints created here stop (``True``, the default) or
    do not stop (``False``) recomputing once every tensor saved during forward is recomputed.

    Turning early stop off re-runs each function to its end during backward: slower, but side
    effects in the function (printing, counters) happen once per backward as they did forward.
    """
    global _EARLY_STOP
    previous = _EARLY_STOP
    _EARLY_STOP = bool(enable)
    try:
        yield
    finally:
        _EARLY_STOP = previous


def _torch_switch(name: str) -> bool | None:
    """The value of one of ``torch.utils.checkpoint``'s module switches (set by its
    ``set_checkpoint_early_stop`` / ``set_checkpoint_debug_enabled``); ``None`` when unset or
    when this torch has no such switch."""
    value = getattr(_torch_checkpoint, name, None)
    return None if value is None else bool(value)


def early_stop_override() -> bool | None:
    """The value set by the innermost active :func:`set_checkpoint_early_stop`, else by
    ``torch.utils.checkpoint.set_checkpoint_early_stop``, if any: code written for
    torch's checkpoint flips torch's switch, and it governs ours too (ours wins when both are
    set)."""
    return (
        _EARLY_STOP if _EARLY_STOP is not None else _torch_switch("_enable_checkpoint_early_stop")
    )


# Set by ``set_checkpoint_debug_enabled``; ``None`` defers to each call's ``debug`` argument.
_DEBUG: bool | None = None


@contextlib.contextmanager
def set_checkpoint_debug_enabled(enabled: bool | None) -> Iterator[None]:
    """Within this block, checkpoints run in debug mode (``True``), not in debug mode
    (``False``) whatever their ``debug`` argument says, or as their argument says (``None``).

    Same contract as ``torch.utils.checkpoint.set_checkpoint_debug_enabled``: read when the
    checkpointed forward runs.
    """
    global _DEBUG
    previous = _DEBUG
    _DEBUG = enabled
    try:
        yield
    finally:
        _DEBUG = previous


def debug_override() -> bool | None:
    """The value set by the innermost active :func:`set_checkpoint_debug_enabled`, else by
    ``torch.utils.checkpoint.set_checkpoint_debug_enabled``, if any (ours wins when both are
    set)."""
    return _DEBUG if _DEBUG is not None else _torch_switch("_checkpoint_debug_enabled")


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Yield every tensor in ``obj``, looking inside lists, tuples (named or not) and dicts.

    Other objects are opaque: a tensor held by a custom object is not found, the same rule as
    PyTorch's tree utilities for the containers it does not register.
    """
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)


class _Slot:
    """Marks where a tensor was in a structure whose tensors are stored elsewhere."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<tensor slot>"


SLOT = _Slot()


def blank_tensors(obj: Any) -> Any:
    """``obj`` with every tensor replaced by :data:`SLOT` (see :func:`fill_tensors`)."""
    return _map(obj, lambda x: isinstance(x, torch.Tensor), lambda _t: SLOT)


def fill_tensors(obj: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """Undo :func:`blank_tensors`: replace each :data:`SLOT` by the next of ``tensors``."""
    return _map(obj, lambda x: x is SLOT, lambda _s: next(tensors))


def _map(obj: Any, is_leaf: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    if is_leaf(obj):
        return fn(obj)
    if not isinstance(obj, (list, tuple, dict)) or not _contains(obj, is_leaf):
        return obj
    if _is_namedtuple(obj):
        return type(obj)(*(_map(item, is_leaf, fn) for item in obj))
    if isinstance(obj, tuple):
        items = tuple(_map(item, is_leaf, fn) for item in obj)
        return items if type(obj) is tuple else type(obj)(items)
    if isinstance(obj, list):
        new_list = copy.copy(obj)  # keeps list subclasses and their attributes
        for i, item in enumerate(obj):
            new_list[i] = _map(item, is_leaf, fn)
        return new_list
    new_dict = copy.copy(obj)  # keeps OrderedDict / defaultdict factories
    for key, item in obj.items():
        new_dict[key] = _map(item, is_leaf, fn)
    return new_dict


def _contains(obj: Any, is_leaf: Callable[[Any], bool]) -> bool:
    if is_leaf(obj):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_contains(item, is_leaf) for item in obj)
    if isinstance(obj, dict):
        return any(_contains(item, is_leaf) for item in obj.values())
    return False
