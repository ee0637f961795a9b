"""``Checkpoint``: save and restore an object graph (TF's ``tf.train.Checkpoint`` semantics)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import NotFoundError
from . import storage_io
from .checkpoint_state import update_checkpoint_state
from .errors import DuplicateDependencyError, NotTrackableError
from .module import Module
from .naming import OBJECT_GRAPH_KEY, encode_object_graph, parse_object_graph, serialize
from .restore import (
    CheckpointLoadStatus,
    InitializationOnlyStatus,
    NameBasedLoadStatus,
    RestoreCoordinator,
    restore_by_name,
)
from .trackable import Trackable, ValueSpec, as_trackable
from .variables import Variable
from .wrappers import wrap_value

__all__ = ["Checkpoint"]

_SAVE_COUNTER = "save_counter"


def _require_trackable(name: str, value: Any) -> Trackable:
    tracked = as_trackable(value)
    if tracked is None:
        raise NotTrackableError(
            f"`Checkpoint` was expecting {name} to be a trackable object (a Variable, Module or "
            "other Trackable, a list/dict of them, an object with state_dict()/"
            f"load_state_dict(), or an object with a registered adapter), got {value!r}. Plain "
            "numbers, strings, sets and tuples without trackables are not saved; wrap them in a "
            "Variable or register an adapter with register_trackable_adapter()."
        )
    return tracked


class Checkpoint(Module):
    """Groups trackable objects and saves/restores them.

    ``Checkpoint(root=None, **kwargs)``: each keyword becomes a root-level dependency named by
    the keyword (inserted in sorted order); with ``root`` the root's own dependencies are
    top-level too (no ``root/`` prefix). ``save_counter`` (int64) is created on the first
    ``save()``/``restore()`` or on first access and is listed after the keywords.
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        self._sp_root_object: Trackable | None = None
        self._sp_save_counter: Variable | None = None
        if root is not None:
            root = wrap_value(root)
            self._sp_root_object = _require_trackable("root", root)
        for name in sorted(kwargs):
            value = wrap_value(kwargs[name])
            tracked = _require_trackable(name, value)
            if self._sp_root_object is not None:
                existing = self._sp_root_object._sp_lookup(name)
                if existing is tracked:
                    object.__setattr__(self, name, value)
                    continue
                if existing is not None:
                    raise DuplicateDependencyError(
                        f"Cannot create a Checkpoint with keyword argument {name} if "
                        f"root.{name} already exists (and is a different object)."
                    )
            setattr(self, name, value)

    # -- root delegation ---------------------------------------------------------------------
    @property
    def root(self) -> Trackable | None:
        """The ``root`` object, if one was given."""
        return self._sp_root_object

    def _sp_children(self) -> Mapping[str, Trackable]:
        own = super()._sp_children()
        if self._sp_root_object is None:
            return own
        merged = dict(self._sp_root_object._sp_children())
        for name, child in own.items():
            merged.pop(name, None)
            merged[name] = child
        return merged

    def _sp_lookup(self, name: str) -> Trackable | None:
        found = super()._sp_lookup(name)
        if found is None and self._sp_root_object is not None:
            found = self._sp_root_object._sp_lookup(name)
        return found

    def _sp_defer(self, name: str, position: Any) -> None:
        # a missing top-level dependency will appear on the root object (root.x = ...), except
        # save_counter which the Checkpoint itself creates
        if self._sp_root_object is not None and name != _SAVE_COUNTER:
            self._sp_root_object._sp_defer(name, position)
        else:
            super()._sp_defer(name, position)

    @property
    def _sp_open_attributes(self) -> bool:  # type: ignore[override]  # class flag, per-root here
        root = self._sp_root_object
        return bool(root is not None and root._sp_open_attributes)

    def _sp_values(self) -> Mapping[str, Any]:
        root = self._sp_root_object
        return {} if root is None else root._sp_values()

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        root = self._sp_root_object
        return {} if root is None else root._sp_value_specs()

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        if self._sp_root_object is not None:
            self._sp_root_object._sp_restore_values(values)

    # -- save counter --------------------------------------------------------------------------
    @property
    def save_counter(self) -> Variable:
        """Number of ``save()`` calls so far; reading it creates it (value 0) if absent."""
        if self._sp_save_counter is None:
            counter = Variable(np.int64(0), name=_SAVE_COUNTER, trainable=False)
            self._sp_save_counter = counter
            # tracking runs any restore waiting for "save_counter" (restore-on-create)
            self._sp_track(_SAVE_COUNTER, counter)
        return self._sp_save_counter

    # -- writing -------------------------------------------------------------------------------
    def write(self, file_prefix: str | os.PathLike, options: Any = None) -> str:
        """Write exactly at ``file_prefix``; no numbering, no state file, counter untouched."""
        prefix = os.fspath(file_prefix)
        values, document = serialize(self)
        storage_io.write_checkpoint(prefix, values, encode_object_graph(document))
        return prefix

    def save(self, file_prefix: str | os.PathLike, options: Any = None) -> str:
        """Increment ``save_counter``, write ``<prefix>-<n>``, record it in the state file."""
        prefix = os.fspath(file_prefix)
        counter = self.save_counter
        counter.assign_add(1)
        path = self.write(f"{prefix}-{int(counter)}")
        update_checkpoint_state(os.path.dirname(path), path)
        return path

    # -- reading -------------------------------------------------------------------------------
    def read(
        self, save_path: str | os.PathLike, options: Any = None
    ) -> CheckpointLoadStatus | NameBasedLoadStatus:
        """Restore without save-counter handling (never creates ``save_counter``)."""
        return self._read(os.fspath(save_path), hint=False)

    def restore(
        self, save_path: str | os.PathLike | None, options: Any = None
    ) -> CheckpointLoadStatus | NameBasedLoadStatus | InitializationOnlyStatus:
        """Restore from ``save_path`` (None: nothing, an initialization-only status).

        Values of existing objects are assigned now; values whose objects do not exist yet are
        restored when those objects are attached. ``save_counter`` is created afterwards, so
        numbering continues from a ``save()``d checkpoint.
        """
        if save_path is None:
            return InitializationOnlyStatus()
        status = self._read(os.fspath(save_path), hint=True)
        _ = self.save_counter  # create it; restores it if the checkpoint has one
        return status

    def _read(self, path: str, hint: bool) -> CheckpointLoadStatus | NameBasedLoadStatus:
        try:
            reader = storage_io.open_reader(path)
        except FileNotFoundError as exc:
            if storage_io.checkpoint_exists(path):
                raise  # the index is there: the error names the missing shard
            raise NotFoundError(_not_found_message(path, hint)) from exc
        if OBJECT_GRAPH_KEY not in reader:
            return restore_by_name(reader, self)
        document = parse_object_graph(reader[OBJECT_GRAPH_KEY])
        coordinator = RestoreCoordinator(reader, document, path, self)
        status = CheckpointLoadStatus(coordinator, self)
        coordinator.bind_and_restore(0, self)
        return status

    def __repr__(self) -> str:
        names = ", ".join(self._sp_children())
        return f"<sp.Checkpoint ({names})>"


def _not_found_message(path: str, hint: bool) -> str:
    message = f"No checkpoint found at {path} ({path}.index does not exist)."
    if hint:
        message = f"Error when restoring from checkpoint at {path}: {message}"
        if os.path.isdir(path):
            message += (
                " The path is a directory; pass a checkpoint prefix such as "
                "sp.latest_checkpoint(directory)."
            )
        else:
            message += (
                " Please double-check that the path is correct. You may be missing the "
                "checkpoint suffix (e.g. the '-1' in 'path/to/ckpt-1')."
            )
    return message
