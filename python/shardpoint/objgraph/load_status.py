"""What a restore tells its caller: the load statuses of ``restore()``/``read()`` (their
assertions evaluated live, when called), the status of a restore before any checkpoint exists,
and name-based restore (checkpoints without an object graph) with its status."""

from __future__ import annotations

import logging
from typing import Any

from .errors import DTypeMismatchError, LoadStatusError, ShapeMismatchError
from .naming import ATTRIBUTES, OBJECT_GRAPH_KEY, _escape_attribute, attribute_key, walk
from .restore import RestoreCoordinator, _numpy_scalar_entry, _short
from .state_dict_adapter import STRUCTURE_ATTRIBUTE
from .trackable import Trackable

__all__ = [
    "CheckpointLoadStatus",
    "InitializationOnlyStatus",
    "NameBasedLoadStatus",
    "restore_by_name",
]

logger = logging.getLogger("shardpoint")
_SHOW = 10  # how many unmatched objects a message lists


def _state_dict_hint(unused_names: Any) -> str:
    """Why a checkpoint's state-dict layout does not fit an object restored another way."""
    if not any(STRUCTURE_ATTRIBUTE in names for names in unused_names):
        return ""
    return (
        f"\nAn object with a {STRUCTURE_ATTRIBUTE} attribute was saved through its state_dict() "
        "by the generic adapter (before issue 22, shardpoint did that for a torch.nn.Module "
        "subclass tracked with only `import shardpoint`, without its optimizer's moments). To "
        "read it, track that object as shardpoint.torch.TorchStateDictTrackable(obj) for this "
        "restore."
    )


def _live_valued(root: Trackable) -> list[tuple[str, Any]]:
    """(display path, object) for every live object that holds values, breadth-first."""
    graph = walk(root)
    out = []
    for node, obj in enumerate(graph.objects):
        if obj._sp_value_specs() or obj._sp_open_attributes:
            out.append((graph.display_path(node), obj))
    return out


class CheckpointLoadStatus:
    """Returned by ``restore()``/``read()``; assertions are evaluated live, when called (ST-07)."""

    def __init__(self, coordinator: RestoreCoordinator, root: Trackable) -> None:
        self._coordinator = coordinator
        # strong: the assertions walk the live graph from the root, which must stay alive for
        # as long as the status can be asked (the coordinator itself holds objects weakly)
        self._root = root

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Every checkpointed value was matched and every live value was restored."""
        c = self._coordinator
        for node in c.unresolved_nodes():
            keys = [a["key"] for a in c.nodes[node]["attributes"]]
            raise LoadStatusError(
                f"Unresolved object in checkpoint {c.paths[node]}: its values {keys} have no "
                "matching Python object (the dependency does not exist yet, or has a different "
                "name in the program)."
            )
        pending = c.pending_slots()
        if pending:
            raise LoadStatusError(
                "Unresolved slot variables in checkpoint: "
                + "; ".join(c.paths[sr.slot_node] for sr in pending)
                + ". The variable and its optimizer must both be attached (and the optimizer "
                "must implement the slot protocol) for slots to be restored."
            )
        unused = c.live_unused()
        if unused:
            raise LoadStatusError(
                "Unused attributes in these objects (the attributes exist in the checkpoint but "
                "were not restored):\n"
                + "\n".join(f"{c.paths[n]} ({_short(obj)}): {names}" for n, obj, names in unused)
                + _state_dict_hint(names for _, _, names in unused)
            )
        self.assert_existing_objects_matched()
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Every live object that holds values was bound to a checkpointed value."""
        root = self._root
        c = self._coordinator
        unmatched = [f"{p}: {_short(o)}" for p, o in _live_valued(root) if not c.is_matched(o)]
        if unmatched:
            n = len(unmatched)
            raise LoadStatusError(
                f"Found {n} Python objects that were not bound to checkpointed values, likely "
                f"due to changes in the Python program. Showing {min(_SHOW, n)} of {n} unmatched "
                f"objects: [{', '.join(unmatched[:_SHOW])}]"
            )
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Something besides the root object matched."""
        c = self._coordinator
        if any(node != 0 for node in c.resolved):
            return self
        root = self._root
        valued = [(p, o) for p, o in _live_valued(root) if o is not root]
        if not valued:
            raise LoadStatusError(
                f"Nothing to load. No dependencies have been added to {_short(root)} yet."
            )
        raise LoadStatusError(
            "Nothing except the root object matched a checkpointed value. Typically this means "
            "that the checkpoint does not match the Python program. The following objects have "
            f"no matching checkpointed value: [{', '.join(p for p, _ in valued[:_SHOW])}]"
        )

    def expect_partial(self) -> CheckpointLoadStatus:
        """Silence the warning about unrestored values when this restore is discarded."""
        self._coordinator.expect_partial = True
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """No-op: values are restored eagerly (TF graph-mode compatibility)."""

    def initialize_or_restore(self, session: Any = None) -> None:
        """No-op: values are restored eagerly (TF graph-mode compatibility)."""


class InitializationOnlyStatus:
    """Status of ``restore(None)``: nothing was restored; every assertion fails (RES-11)."""

    _MESSAGE = "No checkpoint specified (save_path=None); nothing is being restored."

    def assert_consumed(self) -> InitializationOnlyStatus:
        raise LoadStatusError(self._MESSAGE)

    def assert_existing_objects_matched(self) -> InitializationOnlyStatus:
        raise LoadStatusError(self._MESSAGE)

    def assert_nontrivial_match(self) -> InitializationOnlyStatus:
        raise LoadStatusError(self._MESSAGE)

    def expect_partial(self) -> InitializationOnlyStatus:
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """No-op."""

    def initialize_or_restore(self, session: Any = None) -> None:
        """No-op."""


class NameBasedLoadStatus:
    """Status of a restore from a file without an object graph (matched by key, KEY-02)."""

    def __init__(self, missing: list[str], unused_keys: list[str], restored: int) -> None:
        self._missing = missing
        self._unused = unused_keys
        self._restored = restored

    def assert_consumed(self) -> NameBasedLoadStatus:
        self.assert_existing_objects_matched()
        if self._unused:
            raise LoadStatusError(
                f"Keys in the checkpoint were not restored (no object has them): {self._unused}"
            )
        return self

    def assert_existing_objects_matched(self) -> NameBasedLoadStatus:
        if self._missing:
            raise LoadStatusError(
                "Live values were not found in the checkpoint (matched by key, the checkpoint "
                f"has no object graph): {self._missing[:_SHOW]}"
            )
        return self

    def assert_nontrivial_match(self) -> NameBasedLoadStatus:
        if not self._restored:
            raise LoadStatusError(
                "Nothing matched: the checkpoint has no object graph and none of its keys "
                "equals a key of the live objects."
            )
        return self

    def expect_partial(self) -> NameBasedLoadStatus:
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """No-op."""


def restore_by_name(reader: Any, root: Trackable) -> NameBasedLoadStatus:
    """Restore a checkpoint that has no object graph by computing the live keys.

    Used for files written by ``save_file`` with TF-style keys. There is no deferred restore in
    this mode: only objects that exist now are restored.
    """
    graph = walk(root)
    available = set(reader.keys())
    used: set[str] = set()
    missing: list[str] = []
    restored = 0
    for node, obj in enumerate(graph.objects):
        specs = obj._sp_value_specs()
        values = {}
        for name, spec in specs.items():
            if node in graph.slot_prefix:
                key = f"{graph.slot_prefix[node]}/{ATTRIBUTES}/{_escape_attribute(name)}"
            else:
                key = attribute_key(graph.paths[node], name)
            if key not in available:
                missing.append(key)
                continue
            info = reader.info(key)
            # a numpy scalar saved by save_file, restored into a variable: a 0-d tensor here
            scalar = None if spec is None else _numpy_scalar_entry(reader, key, info)
            if scalar is not None:
                info = scalar[0]
            if spec is not None and tuple(info.shape) != tuple(spec.shape):
                raise ShapeMismatchError(
                    f"Received incompatible tensor with shape {tuple(info.shape)} when attempting "
                    f"to restore {graph.display_path(node)} with shape {tuple(spec.shape)} "
                    f"(checkpoint key {key!r})."
                )
            if spec is not None and str(info.dtype) != spec.dtype:
                raise DTypeMismatchError(
                    f"Checkpoint key {key!r} has dtype {info.dtype} but "
                    f"{graph.display_path(node)} has dtype {spec.dtype}; no implicit cast."
                )
            values[name] = reader[key] if scalar is None else scalar[1]
            used.add(key)
        if values:
            obj._sp_restore_values(values)
            restored += 1
    unused = sorted(available - used - {OBJECT_GRAPH_KEY})
    return NameBasedLoadStatus(missing, unused, restored)
