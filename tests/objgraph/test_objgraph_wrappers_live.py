"""ListWrapper / DictWrapper see the live wrapped list/dict on every method.

The tests are generated from ``dir(list)`` / ``dir(dict)``: each method is called on a wrapper
whose wrapped object was changed from outside, and on that (plain) object itself, with the same
arguments; results, raised exception types and the contents afterwards must agree. A method
added to ``list``/``dict`` by a future Python fails the coverage test until it is classified.
Also: DictWrapper from pairs, copy/deepcopy/pickle, save-time errors naming the method."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.errors import UnsaveableObjectError
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.variables import Variable
from shardpoint.objgraph.wrappers import DictWrapper, ListWrapper

# Not behaviour of the contents: object protocol, construction, and repr/str (deliberately
# "ListWrapper([...])", as TensorFlow's).
_NOT_CONTENT = {
    "__class__", "__class_getitem__", "__delattr__", "__dir__", "__doc__", "__getattribute__",
    "__getstate__", "__hash__", "__init__", "__init_subclass__", "__new__", "__reduce__",
    "__reduce_ex__", "__setattr__", "__subclasshook__", "__repr__", "__str__", "__format__",
}  # fmt: skip

LIST_CALLS: dict[str, list[tuple]] = {
    "__add__": [([9],), ((9,),), ("x",)],
    "__contains__": [(1,), (4,), (99,)],
    "__delitem__": [(0,), (slice(1, 3),), (10,)],
    "__eq__": [([1, 2, 3, 4],), ([1, 2, 3],), ((1, 2, 3, 4),)],
    "__ge__": [([1, 2],), ([1, 2, 3, 4],), ([5],), ((1,),)],
    "__getitem__": [(3,), (-1,), (slice(1, None),), (10,)],
    "__gt__": [([1, 2],), ([1, 2, 3, 4],), ([5],), ((1,),)],
    "__iadd__": [([7],), ((7, 8),), (5,)],
    "__imul__": [(2,), (0,), ("x",)],
    "__iter__": [()],
    "__le__": [([1, 2],), ([1, 2, 3, 4],), ([5],), ((1,),)],
    "__len__": [()],
    "__lt__": [([1, 2],), ([1, 2, 3, 4],), ([5],), ((1,),)],
    "__mul__": [(2,), (0,), ("x",)],
    "__ne__": [([1, 2, 3, 4],), ([1, 2, 3],)],
    "__reversed__": [()],
    "__rmul__": [(3,)],
    "__setitem__": [(0, 7), (slice(0, 2), [8, 9, 10]), (10, 1)],
    "__sizeof__": [()],
    "append": [(5,)],
    "clear": [()],
    "copy": [()],
    "count": [(4,), (1,)],
    "extend": [([5, 6],), (3,)],
    "index": [(4,), (1, 1), (99,)],
    "insert": [(1, 0), (-1, 9)],
    "pop": [(), (0,), (10,)],
    "remove": [(4,), (99,)],
    "reverse": [()],
    "sort": [(), ()],
}
DICT_CALLS: dict[str, list[tuple]] = {
    "__contains__": [("a",), ("new",), ("zz",)],
    "__delitem__": [("a",), ("new",), ("zz",)],
    "__eq__": [({"a": 1, "b": 2, "new": 3},), ({"a": 1, "b": 2},), ([],)],
    "__ge__": [({},)],
    "__getitem__": [("new",), ("zz",)],
    "__gt__": [({},)],
    "__ior__": [({"c": 4},), ([("d", 5)],), (3,)],
    "__iter__": [()],
    "__le__": [({},)],
    "__len__": [()],
    "__lt__": [({},)],
    "__ne__": [({"a": 1, "b": 2, "new": 3},), ({"a": 1},)],
    "__or__": [({"c": 4},), ({"a": 0},), ([("d", 5)],)],
    "__reversed__": [()],
    "__ror__": [({"c": 4},), ({"a": 0},), ([1],)],
    "__setitem__": [("a", 10), ("z", 11)],
    "__sizeof__": [()],
    "clear": [()],
    "copy": [()],
    "fromkeys": [(["x", "y"],), (["x"], 0)],
    "get": [("new",), ("zz", 5)],
    "items": [()],
    "keys": [()],
    "pop": [("new",), ("zz",), ("zz", 1)],
    "popitem": [()],
    "setdefault": [("new", 9), ("q", 8)],
    "update": [({"a": 5},), ([("e", 6)],)],
    "values": [()],
}


def _outcome(fn, args):
    try:
        value = fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception type is part of the behaviour
        return ("raised", type(e))
    if value is NotImplemented:
        return ("NotImplemented",)
    if hasattr(value, "__next__") or type(value).__name__.startswith("dict_"):
        value = list(value)  # iterators and views: compare what they yield
    if isinstance(value, ListWrapper | DictWrapper):
        value = value._sp_storage  # in-place operators return the wrapper
    if isinstance(value, list | dict):
        value = (type(value) if not isinstance(value, ListWrapper | DictWrapper) else "same", value)
    return ("value", value)


def _live_list():
    plain = [1, 2, 3]
    m = Module()
    m.l = plain
    plain.append(4)  # changed from outside: the wrapper must see [1, 2, 3, 4]
    return m.l, plain


def _live_dict():
    plain = {"a": 1, "b": 2}
    m = Module()
    m.d = plain
    plain["new"] = 3
    return m.d, plain


def test_every_list_method_is_classified():
    assert set(dir(list)) - _NOT_CONTENT == set(LIST_CALLS)


def test_every_dict_method_is_classified():
    assert set(dir(dict)) - _NOT_CONTENT == set(DICT_CALLS)


@pytest.mark.parametrize("name", sorted(LIST_CALLS))
def test_list_wrapper_method_sees_live_list(name):
    for args in LIST_CALLS[name]:
        wrapper, plain = _live_list()
        reference = list(plain)  # a plain list with the live contents
        if name == "__sizeof__":  # size depends on capacity: compare with the wrapped list
            assert wrapper.__sizeof__() == plain.__sizeof__()
            continue
        got = _outcome(getattr(wrapper, name), args)
        want = _outcome(getattr(reference, name), args)
        assert got == want, (name, args)
        assert list(iter(wrapper)) == reference, (name, args)  # same contents afterwards
        assert wrapper == reference and len(wrapper) == len(reference)


@pytest.mark.parametrize("name", sorted(DICT_CALLS))
def test_dict_wrapper_method_sees_live_dict(name):
    for args in DICT_CALLS[name]:
        wrapper, plain = _live_dict()
        reference = dict(plain)
        if name == "__sizeof__":
            assert wrapper.__sizeof__() == plain.__sizeof__()
            continue
        fn_w, fn_r = getattr(wrapper, name), getattr(reference, name)
        got = _outcome(fn_w, args)
        want = _outcome(fn_r, args)
        if name == "fromkeys":  # a classmethod: the wrapper class builds a wrapper
            assert isinstance(fn_w(*args), DictWrapper) and got[1][1] == want[1][1]
            continue
        assert got == want, (name, args)
        assert list(wrapper.items()) == list(reference.items()), (name, args)


def test_operators_from_either_side_see_live_contents():
    w, plain = _live_list()
    assert w > [1, 2] and w >= [1, 2, 3, 4] and not w <= [1, 2] and w < [5]
    assert [1, 2] < w and [0] + w == [0, 1, 2, 3, 4] and 2 * w == [1, 2, 3, 4] * 2
    d, _ = _live_dict()
    assert list(reversed(d)) == ["new", "b", "a"]
    assert {"z": 0} | d == {"z": 0, "a": 1, "b": 2, "new": 3}
    assert d | {"z": 0} == {"a": 1, "b": 2, "new": 3, "z": 0}
    plain = {"z": 0}
    plain |= d
    assert plain == {"z": 0, "a": 1, "b": 2, "new": 3}
    keys, values, items = d.keys(), d.values(), d.items()
    d._sp_storage["later"] = 4  # views stay live
    assert "later" in keys and 4 in values and ("later", 4) in items


def test_dict_wrapper_from_pairs_and_keywords():
    assert DictWrapper([("a", 1), ("b", 2)]) == {"a": 1, "b": 2}
    assert DictWrapper(a=1) == {"a": 1}
    assert DictWrapper([("a", 1)], b=2) == {"a": 1, "b": 2}
    v = Variable(np.float32(1.0))
    w = DictWrapper([("v", v)])
    assert w._sp_children() == {"v": v}


def test_copy_deepcopy_and_pickle_of_plain_contents():
    w, _ = _live_list()
    d, _ = _live_dict()
    for wrapper in (w, d):
        for clone in (
            copy.copy(wrapper),
            copy.deepcopy(wrapper),
            pickle.loads(pickle.dumps(wrapper)),
        ):
            assert type(clone) is type(wrapper) and clone == wrapper
            assert clone._sp_storage is not wrapper._sp_storage
    nested = ListWrapper([[1, 2], {"a": [3]}])
    deep = copy.deepcopy(nested)
    deep[0].append(9)
    assert nested[0] == [1, 2]
    assert pickle.loads(pickle.dumps(nested, protocol=2)) == [[1, 2], {"a": [3]}]


@pytest.mark.parametrize(
    "mutate,method",
    [
        (lambda lst: lst.__setitem__(slice(0, 1), [Variable(np.float32(2))]), "__setslice__"),
        (lambda lst: lst.__delitem__(slice(0, 1)), "__delslice__"),
        (lambda lst: lst.__setitem__(0, Variable(np.float32(2))), "__setitem__"),
        (lambda lst: lst.pop(), "pop"),
        (lambda lst: lst.sort(key=id), "sort"),
        (lambda lst: lst.insert(0, 1), "insert"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_save_error_names_the_offending_method_as_tensorflow(tmp_path, mutate, method):
    m = Module()
    m.l = [Variable(np.float32(0)), Variable(np.float32(1))]
    mutate(m.l)
    mutate_copy = copy.copy(m.l)  # DS-07: the dirty state and its method are inherited
    with pytest.raises(UnsaveableObjectError) as info:
        Checkpoint(m=m).write(str(tmp_path / "ck"))
    text = str(info.value)
    assert "A list element was replaced (__setitem__, __setslice__), deleted " in text
    assert "(__delitem__, __delslice__), or moved (sort)." in text  # TensorFlow's sentence
    assert f"`{method}`" in text
    with pytest.raises(UnsaveableObjectError, match=f"`{method}`"):
        mutate_copy._sp_check_saveable()
