"""Errors raised by the object-graph layer (Checkpoint, tracking, restore, manager).

Every class derives from :class:`shardpoint.errors.CheckpointError` and from the builtin that
TensorFlow raises for the same situation, so code written against TF's exception types
(``ValueError``, ``TypeError``, ``AssertionError``, ``NotImplementedError``) keeps working.
"""

from __future__ import annotations

from ..errors import CheckpointError

__all__ = [
    "NotTrackableError",
    "DuplicateDependencyError",
    "UnsaveableObjectError",
    "SlotReuseError",
    "RestoreMismatchError",
    "ShapeMismatchError",
    "DTypeMismatchError",
    "LoadStatusError",
    "CheckpointStateError",
    "StatePathConflictError",
    "DirectoryInUseError",
]


class NotTrackableError(CheckpointError, TypeError, ValueError):
    """A value that cannot be tracked was given where a trackable is required.

    TF raises ``TypeError`` from ``_track_trackable`` and ``ValueError`` from ``Checkpoint(...)``
    for the same mistake; this class is both, so either ``except`` clause catches it.
    """


class DuplicateDependencyError(CheckpointError, ValueError):
    """An explicit track under a name already bound to another object (no overwrite)."""


class UnsaveableObjectError(CheckpointError, ValueError):
    """A tracked container was mutated in a way that breaks restore-on-create."""


class SlotReuseError(CheckpointError, NotImplementedError):
    """A slot variable is also a regular dependency, or has dependencies of its own."""


class RestoreMismatchError(CheckpointError, ValueError):
    """A checkpointed value does not fit the live object it is restored into."""


class ShapeMismatchError(RestoreMismatchError):
    """Shape of the checkpointed tensor differs from the live variable's shape."""


class DTypeMismatchError(RestoreMismatchError):
    """Dtype of the checkpointed tensor differs from the live variable's dtype (no silent cast)."""


class LoadStatusError(CheckpointError, AssertionError):
    """A load-status assertion (assert_consumed & co.) failed."""


class CheckpointStateError(CheckpointError, ValueError):
    """The ``checkpoint`` state file is empty or cannot be used."""


class StatePathConflictError(CheckpointError, RuntimeError):
    """A checkpoint path would overwrite the ``checkpoint`` state file (SAVE-09)."""


class DirectoryInUseError(CheckpointError, RuntimeError):
    """A CheckpointManager in another process manages this directory already."""
