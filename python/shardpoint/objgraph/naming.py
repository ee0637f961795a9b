"""Breadth-first naming of a live object graph, checkpoint keys, and the object-graph JSON.

Naming rules (docs/OBJECT_GRAPH.md has the full schema):

* node 0 is the root; the others are numbered in breadth-first order; each object gets the FIRST
  path found (shortest; equal length: the dependency inserted earlier wins) and is written once;
* slot-variable nodes come after all regular nodes, referenced from their optimizer's node;
* a value's key is the escaped path + ``/.ATTRIBUTES/`` + the escaped attribute name.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError, CorruptCheckpointError
from .errors import SlotReuseError, UnsaveableObjectError
from .trackable import Trackable, as_trackable

__all__ = [
    "OBJECT_GRAPH_KEY",
    "OBJECT_GRAPH_FORMAT",
    "escape_local_name",
    "object_path",
    "attribute_key",
    "slot_variable_key",
    "LiveGraph",
    "walk",
    "serialize",
    "parse_object_graph",
]

#: entry holding the serialized object graph (JSON, utf-8 bytes) in every checkpoint
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
OBJECT_GRAPH_FORMAT = "shardpoint.object_graph"
OBJECT_GRAPH_VERSION = 1
ATTRIBUTES = ".ATTRIBUTES"
OPTIMIZER_SLOT = ".OPTIMIZER_SLOT"


def escape_local_name(name: str) -> str:
    """``.`` → ``..`` first, then ``/`` → ``.S`` (KEY-03): keys stay splittable on ``/``."""
    return name.replace(".", "..").replace("/", ".S")


def object_path(path: tuple[str, ...] | list[str]) -> str:
    """Escaped, ``/``-joined object path ('' for the root)."""
    return "/".join(escape_local_name(p) for p in path)


def _escape_attribute(name: str) -> str:
    # Attribute names may use "/" on purpose (state-dict adapters name nested entries
    # "state/0/exp_avg"); escape each component so the key stays readable and unambiguous.
    return "/".join(escape_local_name(p) for p in name.split("/"))


def attribute_key(path: tuple[str, ...] | list[str], attribute: str) -> str:
    """Key of one saved value: ``net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE``."""
    return f"{object_path(path)}/{ATTRIBUTES}/{_escape_attribute(attribute)}"


def slot_variable_key(
    variable_path: tuple[str, ...], optimizer_path: tuple[str, ...], slot_name: str
) -> str:
    """Object prefix of a slot: ``<var>/.OPTIMIZER_SLOT/<optimizer>/<slot>`` (KEY-04)."""
    return (
        f"{object_path(variable_path)}/{OPTIMIZER_SLOT}/{object_path(optimizer_path)}/"
        f"{escape_local_name(slot_name)}"
    )


@dataclass
class LiveGraph:
    """The live objects reachable from a root, numbered breadth-first."""

    objects: list[Trackable] = field(default_factory=list)
    paths: list[tuple[str, ...]] = field(default_factory=list)
    children: list[list[tuple[str, int]]] = field(default_factory=list)
    # per node: (slot name, original variable node, slot node)
    slots: list[list[tuple[str, int, int]]] = field(default_factory=list)
    # slot node -> its key prefix (slot nodes have no ordinary path)
    slot_prefix: dict[int, str] = field(default_factory=dict)
    ids: dict[int, int] = field(default_factory=dict)

    def add(self, obj: Trackable, path: tuple[str, ...]) -> int:
        node = len(self.objects)
        self.objects.append(obj)
        self.paths.append(path)
        self.children.append([])
        self.slots.append([])
        self.ids[id(obj)] = node
        return node

    def display_path(self, node: int) -> str:
        """``(root).net.l1.kernel`` style path for messages."""
        if node in self.slot_prefix:
            return "(root)." + self.slot_prefix[node].replace("/", ".")
        return ".".join(["(root)", *self.paths[node]])


def walk(root: Trackable, *, for_save: bool = False) -> LiveGraph:
    """Number every object reachable from ``root`` breadth-first, then append slot variables.

    With ``for_save`` each object's ``_sp_check_saveable`` runs (unsaveable wrappers raise) and
    slot variables that are also regular dependencies raise SlotReuseError (SLOT-06).
    """
    graph = LiveGraph()
    graph.add(root, ())
    queue = deque([0])
    while queue:
        node = queue.popleft()
        obj = graph.objects[node]
        if for_save:
            with _naming(graph, node):
                obj._sp_check_saveable()
        for name, child in obj._sp_children().items():
            child_node = graph.ids.get(id(child))
            if child_node is None:
                child_node = graph.add(child, (*graph.paths[node], name))
                queue.append(child_node)
            graph.children[node].append((name, child_node))
    _add_slots(graph, for_save)
    return graph


class _naming:
    """Context manager: an error raised by a saved object's own checks names its path.

    ``UnsaveableObjectError("...")`` from ``_sp_check_saveable``/``_sp_values`` becomes
    ``UnsaveableObjectError("(root).optimizer: ...")``, same class, original chained."""

    def __init__(self, graph: LiveGraph, node: int) -> None:
        self.graph = graph
        self.node = node

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is None or not isinstance(exc, CheckpointError):
            return
        path = self.graph.display_path(self.node)
        if str(exc).startswith(path):
            return
        try:
            named = type(exc)(f"{path}: {exc}")
        except Exception:  # noqa: BLE001 - an error class with another signature: keep it as is
            return
        raise named from exc


def _add_slots(graph: LiveGraph, for_save: bool) -> None:
    regular = len(graph.objects)
    for opt_node in range(regular):
        provider = graph.objects[opt_node]
        slot_fn = getattr(provider, "_sp_slot_variables", None)
        if slot_fn is None:
            continue
        entries = []
        order: dict[str, int] = {}
        dropped: list[tuple[Any, str]] = []
        for variable, slot_name, slot in slot_fn():
            var_tracked = as_trackable(variable)
            var_node = graph.ids.get(id(var_tracked)) if var_tracked is not None else None
            if var_node is None or var_node >= regular:
                # SLOT-01: only slots of reachable variables are saved; a provider that says
                # its slots are part of its state (torch optimizers) refuses to lose them
                dropped.append((variable, slot_name))
                continue
            order.setdefault(slot_name, len(order))
            entries.append((order[slot_name], var_node, slot_name, as_trackable(slot)))
        if for_save and dropped and getattr(provider, "_sp_slots_required", False):
            _refuse_dropped_slots(graph, opt_node, provider, dropped)
        # TF order: slot name first (in first-seen order), then variable node id
        for _, var_node, slot_name, slot in sorted(entries, key=lambda e: (e[0], e[1])):
            if slot is None:
                continue
            if for_save and (id(slot) in graph.ids or slot._sp_children()):
                raise SlotReuseError(
                    f"A slot variable ({slot_name!r} of {graph.display_path(var_node)} in "
                    f"optimizer {graph.display_path(opt_node)}) was re-used as a dependency of a "
                    "trackable object or has dependencies of its own. This is not supported: "
                    "slot variables must be plain variables owned only by their optimizer."
                )
            if id(slot) in graph.ids:
                continue
            slot_node = graph.add(slot, ())
            graph.slot_prefix[slot_node] = slot_variable_key(
                graph.paths[var_node], graph.paths[opt_node], slot_name
            )
            graph.slots[opt_node].append((slot_name, var_node, slot_node))


def _refuse_dropped_slots(
    graph: LiveGraph, opt_node: int, provider: Any, dropped: list[tuple[Any, str]]
) -> None:
    describe = getattr(provider, "_sp_describe_variable", None)
    variables: dict[int, tuple[str, list[str]]] = {}
    for variable, slot_name in dropped:
        label = describe(variable) if callable(describe) else type(variable).__name__
        variables.setdefault(id(variable), (label, []))[1].append(slot_name)
    shown = [f"{label} ({', '.join(slots)})" for label, slots in list(variables.values())[:5]]
    more = f" and {len(variables) - 5} more" if len(variables) > 5 else ""
    raise UnsaveableObjectError(
        f"{graph.display_path(opt_node)}: {getattr(provider, 'name', '') or 'the optimizer'} holds "
        f"state for {len(variables)} variable(s) that are not reachable from the checkpoint's "
        f"root, so that state would not be saved: {'; '.join(shown)}{more}. Track the model "
        "whose parameters it optimizes in the same checkpoint (sp.Checkpoint(model=model, "
        "optimizer=optimizer)), or, to save the optimizer on its own, track its state_dict() "
        "instead (shardpoint.torch.TorchStateDictTrackable(optimizer)). Nothing was written."
    )


def _has_values_flags(graph: LiveGraph, attrs: list[list[dict]]) -> list[bool]:
    """KEY-08: a node has values iff it or any descendant has attributes or slots."""
    n = len(graph.objects)
    flags = [bool(attrs[i]) or bool(graph.slots[i]) for i in range(n)]
    parents: list[list[int]] = [[] for _ in range(n)]
    for parent in range(n):
        for _, child in graph.children[parent]:
            parents[child].append(parent)
    queue = deque(i for i in range(n) if flags[i])
    while queue:  # propagate upwards; cycles terminate because a flag only flips once
        node = queue.popleft()
        for parent in parents[node]:
            if not flags[parent]:
                flags[parent] = True
                queue.append(parent)
    return flags


def serialize(root: Trackable) -> tuple[dict[str, Any], dict[str, Any]]:
    """Collect ``key -> value`` for every saved value and the object-graph document."""
    graph = walk(root, for_save=True)
    values: dict[str, Any] = {}
    attrs: list[list[dict]] = []
    for node, obj in enumerate(graph.objects):
        node_attrs = []
        with _naming(graph, node):
            own_values = obj._sp_values()
        for name, value in own_values.items():
            if node in graph.slot_prefix:
                key = f"{graph.slot_prefix[node]}/{ATTRIBUTES}/{_escape_attribute(name)}"
            else:
                key = attribute_key(graph.paths[node], name)
            values[key] = value
            node_attrs.append(
                {"name": name, "full_name": str(getattr(obj, "name", "") or ""), "key": key}
            )
        attrs.append(node_attrs)
    flags = _has_values_flags(graph, attrs)
    nodes = []
    for node, obj in enumerate(graph.objects):
        entry: dict[str, Any] = {
            "kind": type(obj).__name__,
            "children": [{"name": n, "node": c} for n, c in graph.children[node]],
            "attributes": attrs[node],
            "has_values": flags[node],
        }
        if graph.slots[node]:
            entry["slots"] = [
                {"slot": s, "original": v, "node": sn} for s, v, sn in graph.slots[node]
            ]
        nodes.append(entry)
    document = {"format": OBJECT_GRAPH_FORMAT, "version": OBJECT_GRAPH_VERSION, "nodes": nodes}
    return values, document


def encode_object_graph(document: dict[str, Any]) -> bytes:
    """Compact JSON bytes stored under OBJECT_GRAPH_KEY."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def parse_object_graph(raw: Any) -> dict[str, Any]:
    """Decode and validate the stored object graph (bytes/str/dict)."""
    try:
        if isinstance(raw, bytes | bytearray | memoryview):
            raw = bytes(raw).decode("utf-8")
        document = json.loads(raw) if isinstance(raw, str) else raw
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"object graph entry is not valid JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != OBJECT_GRAPH_FORMAT:
        raise CorruptCheckpointError(
            f"entry {OBJECT_GRAPH_KEY} is not a shardpoint object graph (format field missing)"
        )
    if document.get("version", 0) > OBJECT_GRAPH_VERSION:
        raise CorruptCheckpointError(
            f"object graph version {document.get('version')} is newer than this library reads "
            f"({OBJECT_GRAPH_VERSION})"
        )
    nodes = document.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise CorruptCheckpointError("object graph has no nodes")
    n = len(nodes)
    for i, node in enumerate(nodes):
        ok = isinstance(node, dict)
        ok = ok and all(
            isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and isinstance(c.get("node"), int)
            and 0 <= c["node"] < n
            for c in node.get("children", [])
        )
        ok = ok and all(
            isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("key"), str)
            for a in node.get("attributes", [])
        )
        ok = ok and all(
            isinstance(s, dict)
            and isinstance(s.get("slot"), str)
            and all(isinstance(s.get(k), int) and 0 <= s[k] < n for k in ("original", "node"))
            for s in node.get("slots", [])
        )
        if not ok:
            raise CorruptCheckpointError(f"object graph node {i} is malformed")
    return document
