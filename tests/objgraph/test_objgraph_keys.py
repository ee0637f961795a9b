"""Keys and object graph (catalog KEY-01 … KEY-12)."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.checkpoint_reader import list_variables, load_checkpoint
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.naming import OBJECT_GRAPH_KEY, escape_local_name, serialize
from shardpoint.objgraph.trackable import Trackable, ValueSpec
from shardpoint.objgraph.variables import SlotProvider, Variable


def keys_of(path):
    return [k for k, _ in list_variables(path)]


def graph_of(path):
    with load_checkpoint(path) as reader:
        return json.loads(reader.get_tensor(OBJECT_GRAPH_KEY))


def f32(x):
    return Variable(np.asarray(x, dtype=np.float32))


class Opt(SlotProvider, Module):
    pass


def test_key01_variable_key_is_escaped_path_plus_attributes(tmp_path):
    """KEY-01: net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE."""
    net = Module()
    net.l1 = Module()
    net.l1.kernel = f32([[1.5, 2.5]])
    path = Checkpoint(net=net).write(tmp_path / "k")
    assert "net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(path)


def test_key02_object_graph_entry_is_scalar_bytes(tmp_path):
    """KEY-02: _CHECKPOINTABLE_OBJECT_GRAPH is a scalar string entry; get_tensor gives bytes."""
    path = Checkpoint(v=f32(3.0)).write(tmp_path / "k")
    assert (OBJECT_GRAPH_KEY, []) in list_variables(path)
    with load_checkpoint(path) as reader:
        raw = reader.get_tensor(OBJECT_GRAPH_KEY)
    assert isinstance(raw, bytes)
    assert json.loads(raw)["format"] == "shardpoint.object_graph"


def test_key02_missing_graph_falls_back_to_name_matching(tmp_path):
    """KEY-02: a file without the graph entry is restored by matching keys."""
    from shardpoint import storage

    storage.save_file({"w/.ATTRIBUTES/VARIABLE_VALUE": np.float32(4.25)}, str(tmp_path / "flat"))
    w = f32(0.0)
    status = Checkpoint(w=w).read(tmp_path / "flat")
    assert float(w) == 4.25
    status.assert_consumed()


@pytest.mark.parametrize(
    ("name", "escaped"),
    [("a/b.c", "a.Sb..c"), ("c/", "c.S"), ("d/.S", "d.S..S"), (".ATTRIBUTES", "..ATTRIBUTES")],
)
def test_key03_escaping(name, escaped):
    """KEY-03: '.' -> '..' first, then '/' -> '.S'."""
    assert escape_local_name(name) == escaped


def test_key03_escaped_names_in_keys_and_round_trip(tmp_path):
    """KEY-03: escaped dependency names appear in keys and restore by their raw name."""
    e = Module()
    setattr(e, "x/y.z", f32(1.25))
    setattr(e, ".ATTRIBUTES", f32(2.5))
    path = Checkpoint(e=e).write(tmp_path / "k")
    assert "e/x.Sy..z/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(path)
    assert "e/..ATTRIBUTES/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(path)
    e2 = Module()
    setattr(e2, "x/y.z", f32(0))
    setattr(e2, ".ATTRIBUTES", f32(0))
    Checkpoint(e=e2).read(path).assert_consumed()
    assert float(getattr(e2, "x/y.z")) == 1.25


def test_key04_slot_variable_key(tmp_path):
    """KEY-04: <var>/.OPTIMIZER_SLOT/<optimizer>/<slot>/.ATTRIBUTES/VARIABLE_VALUE."""
    net = Module()
    net.l1 = Module()
    net.l1.kernel = f32([1.0, 2.0])
    opt = Opt()
    opt.add_slot(net.l1.kernel, "m", np.float32([0.5, 0.25]))
    path = Checkpoint(net=net, optimizer=opt).write(tmp_path / "k")
    key = "net/l1/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"
    assert key in keys_of(path)
    with load_checkpoint(path) as reader:
        np.testing.assert_array_equal(reader.get_tensor(key), [0.5, 0.25])


class TwoTensors(Trackable):
    """An object serializing several named values itself."""

    def __init__(self, a, b):
        self.a, self.b = np.asarray(a, np.float32), np.asarray(b, np.float32)

    def _sp_values(self):
        return {"v1": self.a, "v2": self.b}

    def _sp_value_specs(self):
        return {"v1": ValueSpec(self.a.shape, "float32"), "v2": ValueSpec(self.b.shape, "float32")}

    def _sp_restore_values(self, values):
        self.a[...] = values["v1"]
        self.b[...] = values["v2"]


def test_key05_multi_tensor_object_keys_root_and_child(tmp_path):
    """KEY-05: root object keys '/.ATTRIBUTES/v1', child 'child/.ATTRIBUTES/v1'."""
    root = TwoTensors([1.0], [2.0])
    root._sp_track("child", TwoTensors([3.0], [4.0]))
    path = Checkpoint(root).write(tmp_path / "k")
    keys = keys_of(path)
    assert {"/.ATTRIBUTES/v1", "/.ATTRIBUTES/v2", "child/.ATTRIBUTES/v1"} <= set(keys)
    fresh = TwoTensors([0.0], [0.0])
    fresh._sp_track("child", TwoTensors([0.0], [0.0]))
    Checkpoint(fresh).read(path).assert_consumed()
    assert fresh.b[0] == 2.0 and fresh._sp_lookup("child").a[0] == 3.0


def test_key06_breadth_first_first_path_wins(tmp_path):
    """KEY-06: shortest path wins; equal length -> earlier dependency; kwargs sorted."""
    shared = f32(7.0)
    a = Module()
    a.deep = Module()
    a.deep.x = shared
    b = Module()
    b.x = shared  # shorter path: b/x (kwargs sorted: a, b) -> 'a/deep/x' is longer
    c = Module()
    c.p = f32(1.0)
    c.q = c.p  # equal length: p was inserted first
    path = Checkpoint(b=b, a=a, c=c).write(tmp_path / "k")
    keys = keys_of(path)
    assert "b/x/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert not any(k.startswith("a/deep/x") for k in keys)
    assert "c/p/.ATTRIBUTES/VARIABLE_VALUE" in keys and not any(k.startswith("c/q") for k in keys)
    children = [c["name"] for c in graph_of(path)["nodes"][0]["children"]]
    assert children == ["a", "b", "c"]


def test_key07_bfs_node_ids_and_slots_appended(tmp_path):
    """KEY-07: node 0 is the root, BFS order, slot nodes last, referenced from the optimizer."""
    net = Module()
    net.k = f32([1.0])
    net.b = f32([2.0])
    opt = Opt()
    opt.it = Variable(np.int64(3))
    for var in (net.k, net.b):
        opt.add_slot(var, "m")
        opt.add_slot(var, "v")
    ckpt = Checkpoint(net=net, optimizer=opt)
    _, doc = serialize(ckpt)
    nodes = doc["nodes"]
    assert [c["name"] for c in nodes[0]["children"]] == ["net", "optimizer"]
    assert [c["node"] for c in nodes[0]["children"]] == [1, 2]
    opt_node = nodes[2]
    k_node, b_node = (c["node"] for c in nodes[1]["children"])
    slots = [(s["slot"], s["original"], s["node"]) for s in opt_node["slots"]]
    regular = 6  # root, net, optimizer, k, b, it
    assert slots == [
        ("m", k_node, regular),
        ("m", b_node, regular + 1),
        ("v", k_node, regular + 2),
        ("v", b_node, regular + 3),
    ]
    assert len(nodes) == regular + 4
    assert all(not n["children"] for n in nodes[regular:])


def test_key08_children_attributes_and_has_values_flag():
    """KEY-08: children, attributes (name/full_name/key), has_values for value-free subtrees."""
    m = Module()
    m.empty = Module()
    m.empty.deeper = Module()
    m.full = Module()
    m.full.v = Variable(np.float32(1.0), name="vee")
    _, doc = serialize(Checkpoint(m=m))
    nodes = doc["nodes"]
    by_name = {c["name"]: c["node"] for c in nodes[1]["children"]}
    assert nodes[by_name["empty"]]["has_values"] is False
    assert nodes[by_name["full"]]["has_values"] is True
    assert nodes[0]["has_values"] is True
    v_node = nodes[nodes[by_name["full"]]["children"][0]["node"]]
    assert v_node["attributes"] == [
        {"name": "VARIABLE_VALUE", "full_name": "vee", "key": "m/full/v/.ATTRIBUTES/VARIABLE_VALUE"}
    ]


def test_key09_kwargs_are_root_deps_and_save_counter_last(tmp_path):
    """KEY-09: kwargs named by keyword (sorted), save_counter int64 listed after them."""
    ckpt = Checkpoint(zeta=f32(1), alpha=f32(2))
    path = ckpt.save(tmp_path / "s")
    children = [c["name"] for c in graph_of(path)["nodes"][0]["children"]]
    assert children == ["alpha", "zeta", "save_counter"]
    with load_checkpoint(path) as reader:
        assert reader.get_variable_to_dtype_map()["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == (
            "int64"
        )


def test_key10_root_object_deps_are_top_level(tmp_path):
    """KEY-10: Checkpoint(root, extra=x): root's deps top-level, no 'root/' prefix."""
    root = Module()
    root.v = f32(3.0)
    path = Checkpoint(root, extra=f32(5.0)).save(tmp_path / "r")
    keys = keys_of(path)
    assert {
        "v/.ATTRIBUTES/VARIABLE_VALUE",
        "extra/.ATTRIBUTES/VARIABLE_VALUE",
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
    } <= set(keys)
    assert not any(k.startswith("root/") for k in keys)


def test_key11_container_element_names(tmp_path):
    """KEY-11: list index, dict key, nested tuple index, namedtuple field name wins."""
    Point = collections.namedtuple("Point", ["x", "y"])
    m = Module()
    m.listed = [f32(1)]
    m.mapped = {"two": f32(2)}
    m.t = (f32(3), (f32(4),))
    m.nt = Point(f32(5), f32(6))
    path = Checkpoint(m=m).write(tmp_path / "k")
    keys = set(keys_of(path))
    for key in ["m/listed/0", "m/mapped/two", "m/t/0", "m/t/1/0", "m/nt/x", "m/nt/y"]:
        assert f"{key}/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert not any(k.startswith("m/nt/0") for k in keys)
    assert sorted(m.nt._sp_children()) == ["0", "1", "x", "y"]


def test_key12_shared_object_written_once(tmp_path):
    """KEY-12: the list/dict example writes only listed/* (mapped holds the same objects)."""
    ckpt = Checkpoint()
    ckpt.listed = [f32(1.0)]
    ckpt.listed.append(f32(2.0))
    ckpt.mapped = {"one": ckpt.listed[0]}
    ckpt.mapped["two"] = ckpt.listed[1]
    path = ckpt.save(tmp_path / "ex")
    assert keys_of(path) == [
        OBJECT_GRAPH_KEY,
        "listed/0/.ATTRIBUTES/VARIABLE_VALUE",
        "listed/1/.ATTRIBUTES/VARIABLE_VALUE",
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
    ]
