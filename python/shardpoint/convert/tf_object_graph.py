"""TensorFlow's object-graph proto (``_CHECKPOINTABLE_OBJECT_GRAPH``), decoded without TensorFlow.

A ``tf.train.Checkpoint`` stores the graph of the objects it saved as a serialized
``TrackableObjectGraph`` (``tensorflow/core/protobuf/trackable_object_graph.proto``) in a string
tensor of its TensorBundle. The schema is small::

    TrackableObjectGraph   { repeated TrackableObject nodes = 1; }
    TrackableObject        { repeated ObjectReference children = 1;
                             repeated SerializedTensor attributes = 2;
                             repeated SlotVariableReference slot_variables = 3;
                             RegisteredSaver registered_saver = 4;      (ignored)
                             BoolValue has_checkpoint_values = 5; }     (recomputed)
    ObjectReference        { int32 node_id = 1; string local_name = 2; }
    SerializedTensor       { string name = 1; string full_name = 2; string checkpoint_key = 3; }
    SlotVariableReference  { int32 original_variable_node_id = 1; string slot_name = 2;
                             int32 slot_variable_node_id = 3; }

:func:`parse_object_graph_proto` turns it into the object-graph document the restore machinery of
:mod:`shardpoint.objgraph` matches against live objects (the same dict shape shardpoint's own
checkpoints store as JSON), so a TensorFlow checkpoint is matched by graph, edge by edge, exactly
like a shardpoint one.

The bytes are hostile until proven otherwise: every length is checked against the bytes left
before anything is sliced (nothing is allocated beyond the input's own size), the message
nesting is fixed by the schema (no recursion on input), node ids must name existing nodes, names
must be UTF-8, and the number of nodes and edges is capped. Every failure is a
:class:`~shardpoint.errors.CorruptCheckpointError` naming the byte offset.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from ..errors import CorruptCheckpointError

__all__ = ["parse_object_graph_proto", "MAX_GRAPH_BYTES", "MAX_NODES", "MAX_EDGES"]

#: A serialized object graph larger than this is refused before it is read.
MAX_GRAPH_BYTES = 256 << 20
#: Most nodes, and separately most edges + attributes + slots, accepted in one graph (real
#: graphs have a few per variable: ~10^4 to 10^5 for large models). Measured cost of the decoded
#: graph: a node with one edge ~690 bytes, each further edge/attribute ~230, an empty node one
#: shared object; so whatever the input, the decoded graph stays under ~0.5 GB.
MAX_NODES = 1 << 19
MAX_EDGES = 1 << 20
_MAX_NAME_BYTES = 65535


class _Bad(Exception):
    def __init__(self, msg: str, pos: int) -> None:
        super().__init__(msg)
        self.pos = pos


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Bad("truncated varint", start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Bad("varint longer than 10 bytes", start)


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, Any, int]]:
    """(field number, wire type, value, offset) of one message; length-delimited values are
    (start, end) offsets into ``buf``, never copies."""
    while pos < end:
        at = pos
        tag, pos = _varint(buf, pos, end)
        num, wire = tag >> 3, tag & 7
        if num == 0:
            raise _Bad("field number 0", at)
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if n > end - pos:
                raise _Bad(f"field {num}: length {n} runs past its message", at)
            value = (pos, pos + n)
            pos += n
        elif wire == 1:
            if end - pos < 8:
                raise _Bad("truncated fixed64", at)
            value, pos = None, pos + 8
        elif wire == 5:
            if end - pos < 4:
                raise _Bad("truncated fixed32", at)
            value, pos = None, pos + 4
        else:
            raise _Bad(f"unsupported wire type {wire}", at)
        yield num, wire, value, at


def _text(buf: memoryview, span: tuple[int, int], what: str) -> str:
    start, end = span
    if end - start > _MAX_NAME_BYTES:
        raise _Bad(f"{what} longer than {_MAX_NAME_BYTES} bytes", start)
    try:
        return bytes(buf[start:end]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(f"{what} is not UTF-8", start) from None


def _int32(value: int, at: int, what: str) -> int:
    if value >= 1 << 63:
        value -= 1 << 64
    if not 0 <= value < 1 << 31:
        raise _Bad(f"{what} {value} out of range", at)
    return value


def _node(buf: memoryview, start: int, end: int, budget: list[int]) -> dict[str, Any]:
    children: list[dict[str, Any]] = []
    attributes: list[dict[str, str]] = []
    slots: list[dict[str, Any]] = []
    for num, wire, value, at in _fields(buf, start, end):
        if wire != 2 or num not in (1, 2, 3):
            continue  # registered_saver, has_checkpoint_values, unknown fields: ignored
        budget[0] -= 1
        if budget[0] < 0:
            raise _Bad(f"more than {MAX_EDGES} edges, attributes and slots", at)
        fields = {n: (w, v, a) for n, w, v, a in _fields(buf, value[0], value[1])}
        if num == 1:
            node_id = _int32(_get_int(fields, 1, at), at, "child node_id")
            name = _text(buf, _get_span(fields, 2, at), "local_name")
            children.append({"name": name, "node": node_id})
        elif num == 2:
            attributes.append(
                {
                    "name": _text(buf, _get_span(fields, 1, at), "attribute name"),
                    "full_name": _text(buf, _get_span(fields, 2, at), "full_name"),
                    "key": _text(buf, _get_span(fields, 3, at), "checkpoint_key"),
                }
            )
        else:
            slots.append(
                {
                    "original": _int32(_get_int(fields, 1, at), at, "original_variable_node_id"),
                    "slot": _text(buf, _get_span(fields, 2, at), "slot_name"),
                    "node": _int32(_get_int(fields, 3, at), at, "slot_variable_node_id"),
                }
            )
    if not (children or attributes or slots):
        return _EMPTY_NODE  # shared: a graph of empty nodes costs a pointer per node
    entry: dict[str, Any] = {"kind": "tensorflow", "children": children, "attributes": attributes}
    if slots:
        entry["slots"] = slots
    return entry


# Never modified: has_values of a node without attributes, slots or children is False.
_EMPTY_NODE: dict[str, Any] = {
    "kind": "tensorflow",
    "children": (),
    "attributes": (),
    "has_values": False,
}


def _get_int(fields: dict[int, tuple[int, Any, int]], num: int, at: int) -> int:
    wire, value, _ = fields.get(num, (0, 0, at))
    if wire != 0:
        raise _Bad(f"field {num} has wire type {wire}, expected a varint", at)
    return int(value)


def _get_span(fields: dict[int, tuple[int, Any, int]], num: int, at: int) -> tuple[int, int]:
    wire, value, _ = fields.get(num, (2, (0, 0), at))
    if wire != 2:
        raise _Bad(f"field {num} has wire type {wire}, expected bytes", at)
    return value


def _has_values(nodes: list[dict[str, Any]]) -> list[bool]:
    """A node has values iff it or a descendant has attributes or slots (iterative: the graph
    may have cycles)."""
    parents: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for child in node["children"]:
            parents.setdefault(child["node"], []).append(i)
    flags = [bool(n["attributes"]) or bool(n.get("slots")) for n in nodes]
    queue = deque(i for i, f in enumerate(flags) if f)
    while queue:
        for p in parents.get(queue.popleft(), ()):
            if not flags[p]:
                flags[p] = True
                queue.append(p)
    return flags


def parse_object_graph_proto(data: bytes | memoryview, where: str = "object graph") -> dict:
    """Decode a serialized ``TrackableObjectGraph`` into an object-graph document
    (``{"nodes": [{"children": [...], "attributes": [...], "slots": [...], "has_values": ...}]}``).

    ``where`` names the source in error messages. Raises CorruptCheckpointError for anything
    that is not a well-formed graph (truncation, bad lengths, node ids out of range, no nodes).
    """
    buf = memoryview(data).cast("B")
    if len(buf) > MAX_GRAPH_BYTES:
        raise CorruptCheckpointError(
            f"{where}: {len(buf)} bytes is larger than the {MAX_GRAPH_BYTES}-byte limit"
        )
    budget = [MAX_EDGES]
    nodes: list[dict[str, Any]] = []
    offsets: dict[int, int] = {}  # node index -> byte offset, for nodes that reference others
    try:
        for num, wire, value, at in _fields(buf, 0, len(buf)):
            if num != 1 or wire != 2:
                continue
            if len(nodes) >= MAX_NODES:
                raise _Bad(f"more than {MAX_NODES} nodes", at)
            node = _node(buf, value[0], value[1], budget)
            if node is not _EMPTY_NODE:
                offsets[len(nodes)] = at
            nodes.append(node)
        if not nodes:
            raise _Bad("the graph has no nodes (no root object)", 0)
        n = len(nodes)
        for index, at in offsets.items():
            node = nodes[index]
            refs = [c["node"] for c in node["children"]]
            for slot in node.get("slots", ()):
                refs += [slot["original"], slot["node"]]
            for ref in refs:
                if ref >= n:
                    raise _Bad(f"node id {ref} out of range (the graph has {n} nodes)", at)
    except _Bad as e:
        raise CorruptCheckpointError(
            f"{where}: corrupt TrackableObjectGraph proto at byte {e.pos}: {e}"
        ) from None
    for node, flag in zip(nodes, _has_values(nodes), strict=True):
        if node is not _EMPTY_NODE:
            node["has_values"] = flag
    return {"format": "tensorflow.TrackableObjectGraph", "nodes": nodes}
