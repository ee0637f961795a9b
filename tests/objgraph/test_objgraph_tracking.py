"""Tracking rules (TRK-01 … TRK-09) and tracked containers (DS-01 … DS-12)."""

from __future__ import annotations

import collections
import copy
import json

import numpy as np
import pytest

from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.checkpoint_reader import list_variables
from shardpoint.objgraph.errors import (
    DuplicateDependencyError,
    NotTrackableError,
    UnsaveableObjectError,
)
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.trackable import NoDependency
from shardpoint.objgraph.variables import Variable
from shardpoint.objgraph.wrappers import DictWrapper, ListWrapper, TupleWrapper


def f32(x):
    return Variable(np.asarray(x, dtype=np.float32))


def keys_of(path):
    return [k for k, _ in list_variables(path) if not k.startswith("_CHECKPOINTABLE")]


# --- TRK ------------------------------------------------------------------------------------


def test_trk01_attribute_assignment_tracks_and_same_object_is_noop():
    """TRK-01: named dependency; re-assigning the identical object changes nothing."""
    m = Module()
    v = f32(1)
    m.w = v
    assert dict(m._sp_children()) == {"w": v}
    m.other = f32(2)
    m.w = v
    assert list(m._sp_children()) == ["w", "other"]


def test_trk02_reassignment_replaces_dependency(tmp_path):
    """TRK-02: only the new value is saved."""
    m = Module()
    m.mm = Module()
    m.mm.v = f32(1.0)
    m.mm = Module()
    m.mm.v = f32(9.0)
    path = Checkpoint(m=m).write(tmp_path / "k")
    assert keys_of(path) == ["m/mm/v/.ATTRIBUTES/VARIABLE_VALUE"]
    assert float(np.asarray(m.mm.v)) == 9.0


def test_trk03_non_trackables_are_plain_attributes(tmp_path):
    """TRK-03: int, str, float, None, set, defaultdict, arrays, objects: never saved."""
    m = Module()
    m.i, m.s, m.f, m.n = 3, "x", 1.5, None
    m.st = {1, 2}
    m.dd = collections.defaultdict(list)
    m.arr = np.ones(3)
    m.obj = object()
    m.v = f32(1)
    assert list(m._sp_children()) == ["v"]
    assert keys_of(Checkpoint(m=m).write(tmp_path / "k")) == ["m/v/.ATTRIBUTES/VARIABLE_VALUE"]
    assert type(m.st) is set and type(m.dd) is collections.defaultdict


def test_trk04_wrapping_uses_exact_types():
    """TRK-04: list/dict/OrderedDict wrapped; tuples only with trackables; subclasses not."""
    m = Module()
    m.lst = [1]
    m.d = {"a": 1}
    m.od = collections.OrderedDict(a=1)
    m.tv = (f32(1), 2)
    m.tp = (1, 2)
    m.tl = (1, [2])
    m.cnt = collections.Counter("aab")
    m.dd = collections.defaultdict(int)
    assert type(m.lst) is ListWrapper and type(m.d) is DictWrapper and type(m.od) is DictWrapper
    assert isinstance(m.tv, TupleWrapper) and isinstance(m.tl, TupleWrapper)
    assert type(m.tp) is tuple and type(m.cnt) is collections.Counter
    assert type(m.dd) is collections.defaultdict
    assert sorted(m._sp_children()) == ["d", "lst", "od", "tl", "tv"]


def test_trk05_no_dependency():
    """TRK-05: NoDependency stores the unwrapped value without a dependency."""
    m = Module()
    v = f32(1)
    m.v = NoDependency(v)
    assert m.v is v and not m._sp_children()
    m.lst = NoDependency([v])
    assert type(m.lst) is list and not m._sp_children()


def test_trk06_del_removes_dependency():
    """TRK-06."""
    m = Module()
    m.v = f32(1)
    del m.v
    assert not m._sp_children() and not hasattr(m, "v")


def test_trk07_explicit_track_of_non_trackable_is_type_error():
    """TRK-07: TypeError naming the type."""
    with pytest.raises(TypeError, match="<class 'int'>"):
        Module()._sp_track("x", 3)
    with pytest.raises(NotTrackableError):
        Module()._sp_track("x", "s")


def test_trk08_explicit_track_duplicate_name():
    """TRK-08: name already bound to another object, no overwrite -> ValueError."""
    m = Module()
    m._sp_track("dup", f32(1))
    with pytest.raises(DuplicateDependencyError, match="name='dup'"):
        m._sp_track("dup", f32(2))
    assert isinstance(DuplicateDependencyError("x"), ValueError)
    m._sp_track("dup", f32(3), overwrite=True)


def test_trk09_cycles_save_and_deferred_restore(tmp_path):
    """TRK-09: a.b = b; b.a = a saves; restore into a fresh cycle built afterwards."""
    a, b = Module(), Module()
    a.b, b.a = b, a
    a.va, b.vb = f32(1.5), f32(2.5)
    path = Checkpoint(a=a).write(tmp_path / "cyc")
    a2 = Module()
    status = Checkpoint(a=a2).read(path)
    b2 = Module()
    a2.b = b2
    b2.a = a2
    a2.va, b2.vb = f32(0), f32(0)
    status.assert_consumed()
    assert float(np.asarray(a2.va)) == 1.5 and float(np.asarray(b2.vb)) == 2.5


# --- DS -------------------------------------------------------------------------------------


def test_ds01_wrappers_equal_plain_isinstance_unhashable():
    """DS-01."""
    m = Module()
    m.lst = [1, 2]
    m.d = {"a": 1}
    assert m.lst == [1, 2] and [1, 2] == m.lst and m.d == {"a": 1}
    assert isinstance(m.lst, list) and isinstance(m.d, dict)
    with pytest.raises(TypeError, match="unhashable type: 'ListWrapper'"):
        hash(m.lst)
    with pytest.raises(TypeError, match="unhashable type: 'DictWrapper'"):
        hash(m.d)


def test_ds02_list_wrapper_shares_storage():
    """DS-02: changes through either side are visible in both."""
    raw = [1]
    m = Module()
    m.lst = raw
    m.lst.append(2)
    assert raw == [1, 2]
    raw.append(3)
    assert m.lst == [1, 2, 3] and len(m.lst) == 3
    # C-level fast paths see the same elements too (mirror kept in sync by wrapper ops)
    m.lst.append(4)
    assert np.array(m.lst).tolist() == [1, 2, 3, 4]
    assert json.dumps(m.lst) == "[1, 2, 3, 4]"


def test_ds03_append_extend_iadd_imul_stay_saveable(tmp_path):
    """DS-03: new elements named by index."""
    m = Module()
    m.lst = [f32(1)]
    m.lst.append(f32(2))
    m.lst.extend([f32(3)])
    m.lst += [f32(4)]
    m.lst *= 2
    keys = keys_of(Checkpoint(m=m).write(tmp_path / "k"))
    assert keys == [f"m/lst/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(4)]  # 4..7 shared


@pytest.mark.parametrize(
    "mutate",
    [
        lambda lst: lst.__setitem__(0, f32(9)),
        lambda lst: lst.__delitem__(0),
        lambda lst: lst.pop(),
        lambda lst: lst.insert(0, f32(9)),
        lambda lst: lst.sort(key=lambda v: -float(np.asarray(v))),
        lambda lst: lst.__imul__(0),
        lambda lst: lst.remove(lst[0]),
        lambda lst: lst.reverse(),
        lambda lst: lst.clear(),
    ],
    ids=["setitem", "delitem", "pop", "insert", "sort", "imul0", "remove", "reverse", "clear"],
)
def test_ds04_non_append_mutation_unsaveable_at_save_time(tmp_path, mutate):
    """DS-04: the mutation itself succeeds; save raises a clear ValueError."""
    m = Module()
    m.lst = [f32(1), f32(2)]
    mutate(m.lst)  # no error here
    with pytest.raises(UnsaveableObjectError, match="append-only"):
        Checkpoint(m=m).write(tmp_path / "k")
    with pytest.raises(ValueError):
        Checkpoint(m=m).write(tmp_path / "k")


def test_ds05_mutations_without_trackables_stay_saveable(tmp_path):
    """DS-05: lists of plain values may be mutated freely; no children."""
    m = Module()
    m.lst = [3, 1, 2]
    m.lst.insert(0, 5)
    m.lst.sort()
    del m.lst[0]
    m.lst[0] = 7
    m.v = f32(1)
    Checkpoint(m=m).write(tmp_path / "k")
    assert not m.lst._sp_children()


def test_ds06_raw_container_modified_outside_wrapper(tmp_path):
    """DS-06: mutating the original list/dict after wrapping -> save ValueError."""
    raw_list = [f32(1)]
    m = Module()
    m.lst = raw_list
    raw_list.append(f32(2))
    with pytest.raises(UnsaveableObjectError, match="modified outside the wrapper"):
        Checkpoint(m=m).write(tmp_path / "a")
    raw_dict = {"a": f32(1)}
    n = Module()
    n.d = raw_dict
    raw_dict["b"] = f32(2)
    with pytest.raises(UnsaveableObjectError, match="dictionary was modified outside"):
        Checkpoint(n=n).write(tmp_path / "b")


def test_ds07_dirty_state_is_permanent_and_copied(tmp_path):
    """DS-07: dirty survives later appends and copy.copy / copy.deepcopy."""
    m = Module()
    m.lst = [f32(1), f32(2)]
    del m.lst[0]
    m.lst.append(f32(3))
    for dup in (copy.copy(m.lst), copy.deepcopy(m.lst)):
        holder = Module()
        holder.lst = dup
        with pytest.raises(UnsaveableObjectError):
            Checkpoint(h=holder).write(tmp_path / "c")


def test_ds08_dict_overwrite_and_delete_allowed(tmp_path):
    """DS-08."""
    m = Module()
    m.d = {"a": f32(1), "b": f32(2)}
    m.d["a"] = f32(5)
    del m.d["b"]
    keys = keys_of(Checkpoint(m=m).write(tmp_path / "k"))
    assert keys == ["m/d/a/.ATTRIBUTES/VARIABLE_VALUE"]


def test_ds09_non_string_key_to_trackable(tmp_path):
    """DS-09: non-string key -> trackable or mutable container fails; -> plain value is fine."""
    m = Module()
    m.d = {1: f32(1)}
    with pytest.raises(UnsaveableObjectError, match="non-string key"):
        Checkpoint(m=m).write(tmp_path / "a")
    n = Module()
    n.d = {1: [2]}
    with pytest.raises(UnsaveableObjectError, match="non-string key"):
        Checkpoint(n=n).write(tmp_path / "b")
    ok = Module()
    ok.d = {1: 5, "v": f32(2)}
    assert keys_of(Checkpoint(ok=ok).write(tmp_path / "c")) == ["ok/d/v/.ATTRIBUTES/VARIABLE_VALUE"]


def test_ds10_nesting_is_recursive(tmp_path):
    """DS-10: {'a': [v, {'b': w}]} -> nested/a/0 and nested/a/1/b."""
    m = Module()
    m.nested = {"a": [f32(1), {"b": f32(2)}]}
    assert isinstance(m.nested["a"], ListWrapper) and isinstance(m.nested["a"][1], DictWrapper)
    keys = keys_of(Checkpoint(m=m).write(tmp_path / "k"))
    assert keys == [
        "m/nested/a/0/.ATTRIBUTES/VARIABLE_VALUE",
        "m/nested/a/1/b/.ATTRIBUTES/VARIABLE_VALUE",
    ]


def test_ds11_checkpoint_accepts_list_and_dict_not_plain_tuple():
    """DS-11."""
    Checkpoint(x=[1, 2])
    Checkpoint(x={})
    with pytest.raises(ValueError, match="expecting x to be a trackable"):
        Checkpoint(x=(1, 2))


def test_ds12_namedtuple_custom_new_saves_and_tuple_iadd_makes_new_tuple(tmp_path):
    """DS-12: tuple += builds a new plain tuple, wrapper unchanged.

    Difference from TF: a namedtuple subclass with a custom constructor saves fine (we never
    rebuild namedtuples from their fields, so TF's "not constructable" error does not apply).
    """

    class P(collections.namedtuple("P", ["x"])):
        def __new__(cls):
            return super().__new__(cls, f32(4.0))

    m = Module()
    m.p = P()
    assert "m/p/x/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(Checkpoint(m=m).write(tmp_path / "k"))
    m.t = (f32(1),)
    wrapper = m.t
    t = m.t
    t += (f32(2),)
    assert type(t) is tuple and len(wrapper) == 1
    m.t = t
    assert isinstance(m.t, TupleWrapper) and len(m.t) == 2
    assert m.p.x is not None and isinstance(m.p, P)
    twin = copy.deepcopy(m.p)
    assert isinstance(twin, P) and twin.x is not m.p.x and "x" in twin._sp_children()
