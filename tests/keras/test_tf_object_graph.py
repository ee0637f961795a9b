"""TensorFlow's object-graph proto read without TensorFlow: the real graphs of the golden
fixtures, and damaged or hostile bytes (clear errors, bounded memory, never another exception).
Needs neither TensorFlow nor Keras."""

from __future__ import annotations

import os
import random
import shutil
import tracemalloc

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.convert import tf_object_graph
from shardpoint.convert.tensorbundle import TensorBundleReader
from shardpoint.convert.tf_checkpoint import (
    OBJECT_GRAPH_KEY,
    _read_string_scalar,
    read_object_graph,
    restore_from_tensorflow,
    translate_keras2,
)
from shardpoint.convert.tf_object_graph import parse_object_graph_proto
from shardpoint.errors import CorruptCheckpointError

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def graph_bytes(flavour: str) -> bytes:
    reader = TensorBundleReader(os.path.join(FIXTURES, flavour, "ckpt-1"))
    try:
        return _read_string_scalar(reader, OBJECT_GRAPH_KEY)
    finally:
        reader.close()


def paths(document: dict) -> dict[str, int]:
    """BFS display path -> node id."""
    out = {"": 0}
    queue = [0]
    seen = {0}
    while queue:
        node = queue.pop(0)
        prefix = next(p for p, n in out.items() if n == node)
        for child in document["nodes"][node]["children"]:
            if child["node"] not in seen:
                seen.add(child["node"])
                out[f"{prefix}/{child['name']}".lstrip("/")] = child["node"]
                queue.append(child["node"])
    return out


def test_keras3_fixture_graph_decodes_as_tensorflow_wrote_it():
    reader = TensorBundleReader(os.path.join(FIXTURES, "keras3", "ckpt-1"))
    try:
        document = read_object_graph(reader)
    finally:
        reader.close()
    nodes = document["nodes"]
    root = [c["name"] for c in nodes[0]["children"]]
    assert root == ["model", "optimizer", "step", "save_counter"]
    found = paths(document)
    kernel = nodes[found["model/hidden/_kernel"]]
    assert kernel["attributes"] == [
        {
            "name": "VARIABLE_VALUE",
            "full_name": kernel["attributes"][0]["full_name"],
            "key": "model/hidden/_kernel/.ATTRIBUTES/VARIABLE_VALUE",
        }
    ]
    assert "optimizer/_variables/2" in found  # the moments are named through _variables
    momentums = nodes[found["optimizer/_momentums"]]["children"]
    variables = {c["name"]: c["node"] for c in nodes[found["optimizer/_variables"]]["children"]}
    assert momentums[0]["node"] == variables["2"]  # shared objects: one node, two edges
    assert (
        nodes[0]["has_values"]
        and not nodes[found["optimizer/_trainable_variables_indices"]]["has_values"]
    )


def test_legacy_fixture_has_slots_and_translates_to_keras3_names():
    document = parse_object_graph_proto(graph_bytes("tfkeras2_legacy"))
    found = paths(document)
    optimizer = document["nodes"][found["optimizer"]]
    slots = optimizer["slots"]
    assert {s["slot"] for s in slots} == {"m", "v"} and len(slots) == 8
    assert slots[0]["original"] == found["model/hidden/kernel"]
    translate_keras2(document)
    names = {c["name"] for c in optimizer["children"]}
    assert {"_iterations", "_learning_rate", "beta_1"} <= names and "iter" not in names


def test_new_style_tf_keras_optimizer_list_gains_the_learning_rate_slot():
    document = translate_keras2(parse_object_graph_proto(graph_bytes("tfkeras2_new")))
    found = paths(document)
    listed = {
        c["name"]: c["node"] for c in document["nodes"][found["optimizer/_variables"]]["children"]
    }
    assert listed["0"] == found["optimizer/_iterations"]
    assert "1" not in listed and {"2", "9"} <= set(listed)


def test_every_truncation_and_byte_flip_is_a_clean_error_or_a_graph():
    data = graph_bytes("keras3")
    rng = random.Random(5)
    cases = [data[:cut] for cut in range(len(data))]
    for _ in range(400):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cases.append(bytes(damaged))
    errors = 0
    for case in cases:
        try:
            document = parse_object_graph_proto(case)
        except CorruptCheckpointError as e:
            assert "TrackableObjectGraph proto at byte" in str(e) or "no nodes" in str(e)
            errors += 1
            continue
        n = len(document["nodes"])
        for node in document["nodes"]:  # whatever decoded is internally consistent
            assert all(0 <= c["node"] < n for c in node["children"])
    assert errors > len(cases) // 4


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def message(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def test_hostile_graphs_are_refused_with_bounded_memory():
    huge_length = varint(1 << 3 | 2) + varint(1 << 40) + b"x" * 16
    child_out_of_range = message(1, message(1, varint(1 << 3) + varint(7)))
    negative_id = message(1, message(1, varint(1 << 3) + varint((1 << 64) - 1)))
    bad_utf8 = message(1, message(1, varint(1 << 3) + varint(0) + message(2, b"\xff\xfe")))
    deep_varint = b"\x0a" + b"\xff" * 20
    cases = {
        "huge length": (huge_length, "runs past"),
        "child id out of range": (child_out_of_range, "node id 7 out of range"),
        "negative id": (negative_id, "out of range"),
        "bad utf-8": (bad_utf8, "not UTF-8"),
        "endless varint": (deep_varint, "varint"),
        "empty": (b"", "no nodes"),
    }
    tracemalloc.start()
    try:
        for name, (data, match) in cases.items():
            with pytest.raises(CorruptCheckpointError, match=match):
                parse_object_graph_proto(data)
            assert name
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # a 2^40-byte length claim allocates nothing


def test_many_nodes_stay_small_and_are_capped(monkeypatch):
    # 200k empty nodes (2 bytes of input each) share one object: a few pointers per node
    data = message(1, b"") * 200_000
    tracemalloc.start()
    try:
        document = parse_object_graph_proto(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(document["nodes"]) == 200_000 and not document["nodes"][0]["has_values"]
    assert peak < 40 * 200_000
    monkeypatch.setattr(tf_object_graph, "MAX_NODES", 1000)
    with pytest.raises(CorruptCheckpointError, match="more than 1000 nodes"):
        parse_object_graph_proto(message(1, b"") * 1001)
    monkeypatch.setattr(tf_object_graph, "MAX_EDGES", 10)
    edge = message(1, varint(1 << 3) + varint(0))
    with pytest.raises(CorruptCheckpointError, match="more than 10 edges"):
        parse_object_graph_proto(message(1, edge * 11))


def test_damaged_object_graph_bytes_fail_the_checksum(tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(os.path.join(FIXTURES, "keras3"), dst)
    data = dst / "ckpt-1.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    at = raw.find(b"_kernel")
    raw[at] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(
        sp.ChecksumMismatchError, match=r"ckpt-1\.data-00000-of-00001.*object graph"
    ):
        restore_from_tensorflow(sp.Checkpoint(), dst / "ckpt-1")


def test_restore_into_plain_variables_without_keras():
    """No Keras needed: the TF graph restores into sp.Variable stand-ins (the guide's partial
    restore, by graph), int64 -> int64 step, and reports what it did not match."""
    step = sp.Variable(np.int64(0))
    bias = sp.Variable(np.zeros(4, np.float32))
    hidden = sp.Checkpoint(bias=bias)
    root = sp.Checkpoint(step=step, model=sp.Checkpoint(hidden=hidden))
    status = restore_from_tensorflow(root, os.path.join(FIXTURES, "keras3"))
    assert int(step) == 3
    assert bias.numpy().any()
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="optimizer"):
        status.assert_consumed()
    kernel = sp.Variable(np.zeros((3, 4), np.float32))
    hidden._kernel = kernel  # deferred restore by graph edge
    assert kernel.numpy().any()
    status.expect_partial()


def test_object_graph_found_when_the_reader_did_not_keep_it_and_missing_is_clear(
    tmp_path, monkeypatch
):
    from shardpoint.convert import tf_checkpoint

    reader = TensorBundleReader(os.path.join(FIXTURES, "keras3", "ckpt-1"))
    try:
        # the reader keeps a bounded number of skipped entries: the index is searched again
        del reader.skipped[OBJECT_GRAPH_KEY]
        assert len(read_object_graph(reader)["nodes"]) > 10
        monkeypatch.setattr(tf_checkpoint, "_skipped_entry", lambda r, k: None)
        with pytest.raises(CorruptCheckpointError, match="not an object-based"):
            read_object_graph(reader)
    finally:
        reader.close()
    with pytest.raises(sp.NotFoundError):
        restore_from_tensorflow(sp.Checkpoint(), tmp_path / "nothing")


def test_deferred_value_from_a_tf_checkpoint_replaced_meanwhile_is_refused(tmp_path):
    """The files are closed after restore(); a value still waiting is read again when its
    object is attached, and refused if the checkpoint was written over in between."""
    dst = tmp_path / "ck"
    shutil.copytree(os.path.join(FIXTURES, "keras3"), dst)
    hidden = sp.Checkpoint()
    root = sp.Checkpoint(model=sp.Checkpoint(hidden=hidden))
    status = restore_from_tensorflow(root, dst / "ckpt-1")
    shutil.rmtree(dst)
    shutil.copytree(os.path.join(FIXTURES, "tfkeras2_legacy"), dst)  # another save, same path
    with pytest.raises(CorruptCheckpointError, match="replaced since restore"):
        hidden.bias = sp.Variable(np.zeros(4, np.float32))
    status.expect_partial()
