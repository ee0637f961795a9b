"""Restore: matching a checkpoint's object graph to live objects, the deferred queue, load status.

One ``restore()``/``read()`` call creates one :class:`RestoreCoordinator`. It walks the stored
graph from node 0 breadth-first, matching checkpoint edges to live dependencies by local name.
Matched objects get their values immediately (read lazily: only keys that match live objects are
read from disk). A checkpoint child with values but no live dependency of that name is parked on
its live parent (``_sp_defer``) and restored, with its whole subtree, the moment a dependency of
that name is attached. Each coordinator has a uid from a global counter; an object remembers the
uid of the restore that last wrote it, so the restore *called* last wins (RES-05).

The coordinator never keeps the checkpoint's files open between calls: its reader is closed
when the outermost ``bind_and_restore`` returns (the end of ``restore()``, or of a deferred
restore run when a waiting object is attached), even while values still wait for their objects
(TensorFlow's ``test_ckpt_files_closed_after_restoration``: the files of a restore can be
deleted or replaced right after it, and a process restoring many checkpoints does not run out
of descriptors). A value needed later reopens the checkpoint by path, for the duration of that
deferred restore. Before closing, the crc32c of every value still waiting is recorded (and of
every value read); a value whose crc32c differs after a reopen (the checkpoint was replaced at
the same path meanwhile) raises ``CorruptCheckpointError`` instead of restoring data from
another save. It references live objects only weakly (objects that cannot be weakly
referenced, such as tuple wrappers, are held strongly).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import numpy as np

from ..errors import CorruptCheckpointError
from ..storage.dtypes import format_name
from .errors import DTypeMismatchError, ShapeMismatchError
from .restore_order import may_write, next_uid, wrote
from .trackable import Trackable, as_trackable

__all__ = ["RestoreCoordinator", "CheckpointPosition"]

logger = logging.getLogger("shardpoint")


def _ref(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # tuples cannot be weakly referenced: keep them alive instead
        return lambda: obj


@dataclass
class _SlotRestoration:
    optimizer_node: int
    variable_node: int
    slot_node: int
    slot_name: str
    done: bool = False


class CheckpointPosition:
    """A node of one restore's checkpoint graph, waiting for (or bound to) a live object."""

    __slots__ = ("coordinator", "node")

    def __init__(self, coordinator: RestoreCoordinator, node: int) -> None:
        self.coordinator = coordinator
        self.node = node

    @property
    def uid(self) -> int:
        return self.coordinator.uid

    def bind_and_restore(self, obj: Trackable) -> None:
        """Bind ``obj`` to this node and restore it and everything below it."""
        self.coordinator.bind_and_restore(self.node, obj)

    def simple_value(self, attribute: str, shape: Any, dtype: np.dtype) -> np.ndarray | None:
        """The checked value if this node is a plain single-value object, else None."""
        return self.coordinator.simple_value(self.node, attribute, shape, dtype)


class RestoreCoordinator:
    """State of one restore: reader, stored graph, bindings, unused values."""

    def __init__(
        self,
        reader: Any,
        document: dict,
        save_path: str,
        root: Trackable,
        reopen: Callable[[str], Any] | None = None,
    ) -> None:
        self.uid = next_uid()
        self._reader: Any = reader
        self._reopen = reopen
        self._depth = 0  # nesting of bind_and_restore (slots restore from inside it)
        self.save_path = save_path
        self.nodes: list[dict] = document["nodes"]
        self.root_ref = _ref(root)
        self.bound: dict[int, Callable[[], Any]] = {}
        # nodes bound at least once: an object restored and later garbage-collected still
        # counts as resolved (bindings are weak)
        self.resolved: set[int] = set()
        self.matched: dict[int, Callable[[], Any]] = {}
        self.unused: dict[int, tuple[Callable[[], Any], list[str]]] = {}
        self.expect_partial = False
        self.slot_restorations: list[_SlotRestoration] = []
        self.slots_by_node: dict[int, list[_SlotRestoration]] = {}
        self.slot_nodes: set[int] = set()
        for opt_node, node in enumerate(self.nodes):
            for slot in node.get("slots", []):
                sr = _SlotRestoration(opt_node, slot["original"], slot["node"], slot["slot"])
                self.slot_restorations.append(sr)
                self.slot_nodes.add(sr.slot_node)
                self.slots_by_node.setdefault(opt_node, []).append(sr)
                self.slots_by_node.setdefault(sr.variable_node, []).append(sr)
        self.paths = self._display_paths()
        # what still needs a value: valued nodes never bound, slots not restored
        self._waiting_nodes = len(self.unresolved_nodes())
        # key -> crc32c when first seen: a reopened checkpoint must still hold those bytes
        self._crcs: dict[str, int] = {}
        # (key, array) values checked and waiting for the batched read of this restore call
        self._queued: list[tuple[str, Any]] = []

    # -- the reader: open only inside a restore call ------------------------------------------
    @property
    def reader(self) -> Any:
        if self._reader is None:
            if self._reopen is None:
                raise CorruptCheckpointError(f"the reader of {self.save_path} was closed")
            self._reader = self._reopen(self.save_path)
        return self._reader

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        close = getattr(reader, "close", None)
        if close is not None:
            close()

    def release_if_done(self) -> None:
        """Close the reader unless a restore call is running (bug: a restore kept its files
        open as long as its status object lived; then, as long as a value waited for its
        object). The crc32c of every value still waiting is recorded first, so a reopen can
        tell the same checkpoint from one written over it."""
        if self._depth != 0 or self._reader is None:
            return
        try:
            if self._waiting_nodes or self.pending_slots():
                self._record_pending_crcs()
        finally:
            self._close_reader()

    def _pending_keys(self) -> list[str]:
        nodes = self.unresolved_nodes() + [sr.slot_node for sr in self.pending_slots()]
        return [a["key"] for n in nodes for a in self.nodes[n].get("attributes", [])]

    def _record_pending_crcs(self) -> None:
        for key in self._pending_keys():
            if key not in self._crcs:
                crc = getattr(self._info(key), "crc32c", None)
                if crc is not None:
                    self._crcs[key] = crc

    def _info(self, key: str) -> Any:
        try:
            info = self.reader.info(key)
        except KeyError as exc:
            raise CorruptCheckpointError(
                f"the object graph of {self.save_path} names key {key!r} but the checkpoint has "
                "no such entry"
            ) from exc
        crc = getattr(info, "crc32c", None)
        if crc is not None:
            seen = self._crcs.setdefault(key, crc)
            if seen != crc:
                raise CorruptCheckpointError(
                    f"the checkpoint at {self.save_path} was replaced since restore() was called: "
                    f"key {key!r} now has crc32c {crc:#010x}, not {seen:#010x}. Values still "
                    "waiting for their objects are not restored from another save; restore() "
                    "again from the checkpoint you mean."
                )
        return info

    # -- naming for messages -------------------------------------------------------------------
    def _display_paths(self) -> list[str]:
        paths = [""] * len(self.nodes)
        paths[0] = "(root)"
        seen = {0}
        queue = deque([0])
        while queue:
            node = queue.popleft()
            for child in self.nodes[node].get("children", []):
                if child["node"] not in seen:
                    seen.add(child["node"])
                    paths[child["node"]] = f"{paths[node]}.{child['name']}"
                    queue.append(child["node"])
        for sr in self.slot_restorations:
            paths[sr.slot_node] = (
                f"slot {sr.slot_name!r} of {paths[sr.variable_node]} "
                f"(optimizer {paths[sr.optimizer_node]})"
            )
        return paths

    def is_bound(self, node: int) -> bool:
        ref = self.bound.get(node)
        return ref is not None and ref() is not None

    def _bound_object(self, node: int) -> Any:
        ref = self.bound.get(node)
        return None if ref is None else ref()

    # -- matching --------------------------------------------------------------------------------
    def _bind(self, node: int, obj: Trackable) -> bool:
        existing = self._bound_object(node)
        if existing is obj:
            return False
        if existing is not None:
            logger.warning(
                "Inconsistent references when loading the checkpoint into this object graph. "
                "The checkpointed object %s is already bound to %r; not binding it to %r as "
                "well. Either the graph differs between saving and loading or an object was "
                "shared when saving but is not shared now.",
                self.paths[node],
                existing,
                obj,
            )
            return False
        self.bound[node] = _ref(obj)
        if (
            node not in self.resolved
            and node not in self.slot_nodes
            and self.nodes[node].get("attributes")
        ):
            self._waiting_nodes -= 1
        self.resolved.add(node)
        self.matched[id(obj)] = _ref(obj)
        root = getattr(obj, "_sp_root_object", None)
        if root is not None:  # Checkpoint(root=...) restores the root's own values as node 0
            self.matched[id(root)] = _ref(root)
        return True

    def bind_and_restore(self, node: int, obj: Trackable) -> None:
        """Bind ``obj`` to ``node`` and restore the subtree breadth-first; then close the
        reader if nothing waits for a value any more."""
        self._depth += 1
        try:
            self._bind_and_restore(node, obj)
        finally:
            self._depth -= 1
        self.release_if_done()

    def _bind_and_restore(self, node: int, obj: Trackable) -> None:
        # nested calls (slot restorations inside the walk) leave their values queued: the
        # outermost call reads everything queued in one batch
        outermost = self._depth == 1
        try:
            self._bind_and_restore_walk(node, obj)
        except BaseException:
            # values queued before the error land, as they did when each was read at once
            if outermost:
                self._read_queued(raise_errors=False)
            raise
        if outermost:
            self._read_queued()

    def _read_queued(self, raise_errors: bool = True) -> None:
        """Decode every queued value into its object's memory: one batched parallel read."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        try:
            self.reader._read_into(
                [k for k, _ in queued],
                [a.reshape(-1).view(np.uint8) for _, a in queued],
                self.reader._verify,
            )
        except Exception:
            if raise_errors:
                raise

    def _bind_and_restore_walk(self, node: int, obj: Trackable) -> None:
        queue = deque([(node, obj)])
        while queue:
            nid, live = queue.popleft()
            if not self._bind(nid, live):
                continue
            self._restore_values(nid, live)
            for child in self.nodes[nid].get("children", []):
                child_node = child["node"]
                if not self.nodes[child_node].get("has_values", True):
                    continue  # RES-03: nothing below to restore, do not queue
                child_obj = live._sp_lookup(child["name"])
                if child_obj is None:
                    live._sp_defer(child["name"], CheckpointPosition(self, child_node))
                else:
                    queue.append((child_node, child_obj))
            self._run_slot_restorations(nid)

    def _read_checked(self, key: str, shape: Any, dtype: str | None, obj: Any, node: int) -> Any:
        """Check shape/dtype against the index (cheap), then read the value (lazy)."""
        _, scalar = self._check(key, shape, dtype, obj, node)
        return self.reader[key] if scalar is None else scalar[1]

    def _check(
        self, key: str, shape: Any, dtype: str | None, obj: Any, node: int
    ) -> tuple[Any, Any]:
        """The entry of ``key`` checked against the object's shape/dtype: ``(info, scalar)``,
        ``scalar`` being ``(info, value)`` for a numpy scalar entry restored as a 0-d value."""
        info = self._info(key)
        # a numpy scalar saved by save_file, restored into a variable: a 0-d tensor here
        scalar = None if dtype is None else _numpy_scalar_entry(self.reader, key, info)
        if scalar is not None:
            info = scalar[0]
        if dtype is not None:
            kind = getattr(info, "kind", "tensor")
            if kind != "tensor":
                raise DTypeMismatchError(
                    f"Checkpoint key {key!r} holds a {kind} value, not a tensor; cannot restore "
                    f"it into {self.paths[node]} ({_short(obj)}) which expects {dtype}."
                )
            if shape is not None and tuple(info.shape) != tuple(shape):
                raise ShapeMismatchError(
                    f"Received incompatible tensor with shape {tuple(info.shape)} when attempting "
                    f"to restore variable with shape {tuple(shape)} and name "
                    f"{getattr(obj, 'name', type(obj).__name__)} (checkpoint key {key!r}, "
                    f"object {self.paths[node]})."
                )
            if str(info.dtype) != dtype:
                raise DTypeMismatchError(
                    f"Checkpoint key {key!r} has dtype {info.dtype} but {self.paths[node]} "
                    f"({_short(obj)}) has dtype {dtype}; values are never cast implicitly on "
                    "restore."
                )
        return info, scalar

    def _restore_values(self, node: int, obj: Trackable) -> None:
        attributes = self.nodes[node].get("attributes", [])
        if not attributes:
            return
        if not may_write(obj, self.uid):
            return  # a restore() called later already wrote this object
        specs = obj._sp_value_specs()
        # the object's own memory, filled by the batched read at the end of this restore call
        # (files readers only: other readers hand values out one by one)
        targets = obj._sp_value_targets() if hasattr(self.reader, "_read_into") else {}
        values: dict[str, Any] = {}
        unused: list[str] = []
        queued = False
        for attribute in attributes:
            name = attribute["name"]
            if name in specs:
                spec = specs[name]
                shape, dtype = (None, None) if spec is None else (spec.shape, spec.dtype)
                key = attribute["key"]
                if name in targets and spec is not None:
                    info, scalar = self._check(key, shape, dtype, obj, node)
                    if scalar is None and getattr(info, "kind", None) == "tensor":
                        self._queued.append((key, targets[name]))
                        queued = True
                        continue
                values[name] = self._read_checked(key, shape, dtype, obj, node)
            elif obj._sp_open_attributes:
                values[name] = self._read_checked(attribute["key"], None, None, obj, node)
            else:
                unused.append(name)
        if unused:
            self.unused[node] = (_ref(obj), unused)
        if values:
            obj._sp_restore_values(values)
        if values or queued:
            wrote(obj, self.uid)

    # -- slots -------------------------------------------------------------------------------------
    def _run_slot_restorations(self, node: int) -> None:
        for sr in self.slots_by_node.get(node, ()):
            if sr.done:
                continue
            optimizer = self._bound_object(sr.optimizer_node)
            variable = self._bound_object(sr.variable_node)
            if optimizer is None or variable is None:
                continue  # parked until the other side is bound (SLOT-04)
            if not hasattr(optimizer, "_sp_get_slot"):
                continue  # not a slot provider: stays pending, assert_consumed reports it
            later = getattr(optimizer, "_sp_slots_later", None)
            if later is not None and later(partial(self._slots_ready, node)):
                continue  # it creates its slots later (a Keras optimizer builds them all at
                # once on its first step) and calls back then; pending until that happens
            sr.done = True
            existing = optimizer._sp_get_slot(variable, sr.slot_name)
            if existing is not None:
                self.bind_and_restore(sr.slot_node, cast(Trackable, as_trackable(existing)))
                continue
            # restore-on-create (SLOT-03): make the slot from the checkpointed value
            attributes = self.nodes[sr.slot_node].get("attributes", [])
            if not attributes:
                continue
            value = self._read_checked(attributes[0]["key"], None, None, optimizer, sr.slot_node)
            slot = as_trackable(optimizer._sp_create_slot(variable, sr.slot_name, np.array(value)))
            if slot is not None:
                self._bind(sr.slot_node, slot)
                wrote(slot, self.uid)

    def _slots_ready(self, node: int) -> None:
        """Called back by an optimizer (``_sp_slots_later``) once its slots exist."""
        self._depth += 1
        try:
            self._run_slot_restorations(node)
        finally:
            self._depth -= 1
        self.release_if_done()

    # -- restore-on-create for Module.add_variable ------------------------------------------------
    def simple_value(self, node: int, attribute: str, shape: Any, dtype: np.dtype) -> Any:
        entry = self.nodes[node]
        attributes = entry.get("attributes", [])
        if entry.get("children") or entry.get("slots") or len(attributes) != 1:
            return None
        if attributes[0]["name"] != attribute:
            return None
        try:
            value = self._read_checked(attributes[0]["key"], shape, dtype.name, None, node)
            return np.array(value)
        finally:
            self.release_if_done()  # called from outside a restore call (add_variable)

    # -- status support --------------------------------------------------------------------------
    def unresolved_nodes(self) -> list[int]:
        return [
            node
            for node, entry in enumerate(self.nodes)
            if node not in self.slot_nodes and entry.get("attributes") and node not in self.resolved
        ]

    def pending_slots(self) -> list[_SlotRestoration]:
        return [sr for sr in self.slot_restorations if not sr.done]

    def live_unused(self) -> list[tuple[int, Any, list[str]]]:
        """(node, object or None if collected, attribute names) of values never restored."""
        return [(node, ref(), names) for node, (ref, names) in self.unused.items()]

    def is_matched(self, obj: Any) -> bool:
        ref = self.matched.get(id(obj))
        return ref is not None and ref() is obj

    def __del__(self) -> None:
        try:
            if not self.expect_partial and not sys.is_finalizing():
                lines = [
                    f"Value in checkpoint could not be found in the restored object: {self.paths[n]}"
                    for n in self.unresolved_nodes()
                ]
                lines += [
                    f"Slot variable in checkpoint was never restored: {self.paths[sr.slot_node]}"
                    for sr in self.pending_slots()
                ]
                lines += [
                    "An attribute in the restored object could not be found in the checkpoint. "
                    f"Object: {self.paths[n]}, attribute: {names}"
                    for n, _, names in self.live_unused()
                ]
                if lines:
                    logger.warning(
                        "A restore of %s is being discarded with unrestored values (see below). "
                        "To silence this warning, call `status.expect_partial()` on the status "
                        "returned by restore()/read().\n%s",
                        self.save_path,
                        "\n".join(lines),
                    )
            self._close_reader()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (interpreter shutdown)
            pass


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 120 else text[:117] + "..."


def _numpy_scalar_entry(reader: Any, key: str, info: Any) -> tuple[Any, np.ndarray] | None:
    """For an object entry holding a numpy scalar (how ``save_file`` stores ``np.float32(x)``,
    FORMAT.md §6.1): the entry described as the 0-d tensor a variable restores from, and that
    0-d array; ``None`` for every other entry."""
    if getattr(info, "kind", "tensor") != "object":
        return None
    value = reader[key]
    if not isinstance(value, np.generic):
        return None
    arr = np.asarray(value)
    return dataclasses.replace(info, kind="tensor", dtype=format_name(arr.dtype), shape=()), arr
