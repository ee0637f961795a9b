"""The one rule of deferred restore: the ``restore()`` *called* last wins (RES-05).

Every restore gets a uid from one global counter (:func:`next_uid`); every object remembers
the uid of the newest restore that wrote its values (``_TrackState.restore_uid``). The rule has
two halves, and this module is the only place that implements either:

* an object is written by a restore only if no restore called later has written it already
  (:func:`may_write`, :func:`wrote`), whatever order objects are created and attached in;
* where several restores wait for the same missing dependency, they run newest first
  (:func:`newest_first`), so an object created from a checkpoint value (``Module.add_variable``,
  slot variables) starts from the newest one, and older restores then leave it alone.

Where a restore *waits* is the other half of deferral, the protocol of
:class:`~shardpoint.objgraph.trackable.Trackable`: ``_sp_deferral_host(name)`` names the object
that parks a restore waiting for a dependency ``name`` (the object itself, or a ``Checkpoint``'s
root object), and attaching that dependency runs the parked restores through
:func:`newest_first`. Slots follow the same rule: ``RestoreCoordinator`` creates or restores them
through :func:`may_write`/:func:`wrote` like any other object.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

__all__ = ["PendingRestore", "next_uid", "newest_first", "may_write", "wrote"]

_UIDS = itertools.count(1)


class _Waiting(Protocol):
    @property
    def uid(self) -> int: ...


class PendingRestore(_Waiting, Protocol):
    """A restore parked on a :class:`~shardpoint.objgraph.trackable.Trackable` until a dependency
    is attached (``restore.CheckpointPosition`` is one). A protocol here, below both, so that
    ``trackable`` need not import ``restore`` (which imports it)."""

    def bind_and_restore(self, obj: Any) -> None: ...

    def simple_value(self, attribute: str, shape: Any, dtype: Any) -> Any: ...


W = TypeVar("W", bound=_Waiting)


def next_uid() -> int:
    """A fresh restore uid, larger than every earlier one."""
    return next(_UIDS)


def newest_first(positions: Iterable[W]) -> list[W]:
    """The waiting restores in the order they must run: the one called last first."""
    return sorted(positions, key=lambda p: p.uid, reverse=True)


def may_write(obj: Any, uid: int) -> bool:
    """Whether the restore ``uid`` may write ``obj``'s values (no later restore has)."""
    return bool(obj._sp_state().restore_uid <= uid)


def wrote(obj: Any, uid: int) -> None:
    """Record that the restore ``uid`` wrote (or created) ``obj``."""
    state = obj._sp_state()
    state.restore_uid = max(state.restore_uid, uid)
