"""Tracked containers: ``ListWrapper``, ``DictWrapper`` and tuple tracking.

Assigning a plain ``list`` / ``dict`` / ``OrderedDict`` (exact types) to a Module attribute wraps
it so that its trackable elements become dependencies named by index (lists, tuples) or by string
key (dicts). A tuple is wrapped only if it (recursively) contains something trackable, a list, a
dict or a ``NoDependency``. Subclasses (``defaultdict``, ``Counter``), sets and other tuples are
left alone and never saved (TRK-04).

Restore-on-create needs stable names: element *i* of a list must stay element *i*. Lists are
therefore append-only while they hold trackables: any other mutation (replace, delete, insert,
sort, reverse, clear, ``*= 0``) marks the wrapper unsaveable, and the error is raised at save
time, not at mutation time (DS-04). Dicts may overwrite and delete string keys freely (DS-08).

The wrappers are real ``list``/``dict`` subclasses that compare equal to their plain versions.
They share storage with the wrapped object (DS-02): the Python-level methods act on the
original list/dict, and the wrapper's own C-level storage is kept as a mirror so C fast paths
(``np.array(wrapper)``, ``json.dumps``) see the same elements.
"""

from __future__ import annotations

import collections
import copy as _copy
import operator
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, SupportsIndex, cast

from .errors import UnsaveableObjectError
from .trackable import NoDependency, Trackable, as_trackable

__all__ = ["ListWrapper", "DictWrapper", "TupleWrapper", "wrap_value", "is_wrapper"]


def _is_trackable_or_mutable(value: Any) -> bool:
    return as_trackable(value) is not None or isinstance(value, list | dict)


def wrap_value(value: Any) -> Any:
    """Wrap plain containers for tracking; everything else is returned unchanged."""
    if isinstance(value, ListWrapper | DictWrapper | NoDependency) or is_wrapper(value):
        return value
    kind = type(value)
    if kind is list:
        return ListWrapper(value)
    if kind is dict or kind is collections.OrderedDict:
        return DictWrapper(value)
    if isinstance(value, tuple) and _tuple_needs_wrapping(value):
        return TupleWrapper.wrap(value)
    return value


def is_wrapper(value: Any) -> bool:
    """True for the container wrappers of this module."""
    return isinstance(value, ListWrapper | DictWrapper) or getattr(
        type(value), "_sp_is_tuple_wrapper", False
    )


def _tuple_needs_wrapping(value: tuple) -> bool:
    for element in value:
        if isinstance(element, list | dict | NoDependency):
            return True
        if isinstance(element, tuple):
            if _tuple_needs_wrapping(element):
                return True
        elif as_trackable(element) is not None:
            return True
    return False


def _unwrap_element(value: Any, nodep: set[int]) -> Any:
    """Wrap an element being inserted; NoDependency values are stored raw and never tracked."""
    if isinstance(value, NoDependency):
        nodep.add(id(value.value))
        return value.value
    return wrap_value(value)


def _plain(value: Any) -> Any:
    """The shared storage of a wrapper (its C-level mirror may be stale), else the value."""
    return value._sp_storage if isinstance(value, ListWrapper | DictWrapper) else value


class ListWrapper(Trackable, list):
    """A list whose trackable elements are dependencies named ``"0"``, ``"1"``, …

    Invariants. The wrapper holds three sequences. ``_sp_storage`` is the wrapped list itself
    (shared with the user's original object, DS-02) and is the truth: every Python-level method
    reads and writes it. The wrapper's own C-level list storage is a mirror of it, rewritten by
    ``_sp_sync`` after every mutation, so C fast paths (``np.array(w)``, ``json.dumps(w)``) see
    the same elements. ``_sp_snapshot`` is the content as the wrapper last saw it; a difference
    (by identity) between it and ``_sp_storage`` means the original list was changed behind the
    wrapper's back, which makes the wrapper unsaveable if trackables were involved
    (``_sp_dirty = "external"``, DS-07). ``_sp_nodep`` holds the ``id()`` of every element that
    arrived wrapped in ``NoDependency``: those are stored raw and never tracked; ids are safe as
    keys because the list keeps its members alive, and ``_sp_sync`` drops the ids of elements
    that left (so a recycled id never hides a new element). Only
    ``append``/``extend``/``+=`` keep element names stable, so only they keep a list holding
    trackables saveable (``_sp_dirty = "mutation"`` otherwise, DS-04).
    """

    def __init__(self, wrapped: list | None = None) -> None:
        storage = [] if wrapped is None else wrapped
        if not isinstance(storage, list):
            storage = list(storage)
        self._sp_storage: list = storage
        self._sp_nodep: set[int] = set()
        self._sp_dirty: str | None = None  # "mutation" or "external": permanent (DS-07)
        self._sp_dirty_method: str | None = None  # the first non-append mutation, for errors
        for i, element in enumerate(storage):
            storage[i] = _unwrap_element(element, self._sp_nodep)
        self._sp_sync()

    # -- storage helpers ------------------------------------------------------------------
    def _sp_sync(self) -> None:
        list.clear(self)
        list.extend(self, self._sp_storage)
        self._sp_snapshot = list(self._sp_storage)
        if self._sp_nodep:
            self._sp_nodep &= {id(v) for v in self._sp_storage}

    def _sp_has_trackable(self, values: Iterable[Any] | None = None) -> bool:
        it = self._sp_storage if values is None else values
        return any(id(v) not in self._sp_nodep and as_trackable(v) is not None for v in it)

    def _sp_check_external(self) -> None:
        if self._sp_dirty:
            return
        snap = self._sp_snapshot
        cur = self._sp_storage
        if len(snap) != len(cur) or any(a is not b for a, b in zip(snap, cur, strict=True)):
            if self._sp_has_trackable(snap) or self._sp_has_trackable(cur):
                self._sp_dirty = "external"

    def _sp_mutate(self, op: Any, method: str) -> Any:
        """Run a non-append mutation (``method`` names it in the save-time error); mark dirty
        if trackables were involved."""
        self._sp_check_external()
        before = self._sp_has_trackable()
        result = op(self._sp_storage)
        if before or self._sp_has_trackable():
            self._sp_mark_mutated(method)
        self._sp_sync()
        return result

    def _sp_mark_mutated(self, method: str) -> None:
        if self._sp_dirty is None:
            self._sp_dirty = "mutation"
            self._sp_dirty_method = method

    # -- trackable protocol ----------------------------------------------------------------
    def _sp_children(self) -> Mapping[str, Trackable]:
        out: dict[str, Trackable] = {}
        for i, element in enumerate(self._sp_storage):
            if id(element) in self._sp_nodep:
                continue
            tracked = as_trackable(element)
            if tracked is not None:
                out[str(i)] = tracked
        return out

    def _sp_lookup(self, name: str) -> Trackable | None:
        if not name.isdigit():
            return None
        i = int(name)
        if i >= len(self._sp_storage) or id(self._sp_storage[i]) in self._sp_nodep:
            return None
        return as_trackable(self._sp_storage[i])

    def _sp_check_saveable(self) -> None:
        self._sp_check_external()
        if self._sp_dirty == "mutation":
            raise UnsaveableObjectError(
                f"Unable to save the object {self!r} (a list wrapper constructed to track "
                "trackable objects). A list element was replaced (__setitem__, __setslice__), "
                "deleted (__delitem__, __delslice__), or moved (sort). In order to support "
                "restoration on object creation, tracking is exclusively for append-only data "
                f"structures. The list was changed by `{self._sp_dirty_method}` while it held "
                "trackable objects.\n\n"
                "If you don't need this list checkpointed, wrap it in NoDependency; it will be "
                "ignored."
            )
        if self._sp_dirty == "external":
            raise UnsaveableObjectError(
                f"Unable to save the object {self!r} (a list wrapper constructed to track "
                "trackable objects). The wrapped list was modified outside the wrapper (its "
                f"final value was {self._sp_storage!r}, its value when last seen by the wrapper "
                f"was {self._sp_snapshot!r}), which breaks restoration on object creation.\n\n"
                "If you don't need this list checkpointed, wrap it in NoDependency; it will be "
                "ignored."
            )

    # -- append-only mutations (stay saveable, restore on attach) -------------------------
    def append(self, value: Any) -> None:
        self._sp_check_external()
        value = _unwrap_element(value, self._sp_nodep)
        self._sp_storage.append(value)
        list.append(self, value)
        self._sp_snapshot.append(value)
        index = len(self._sp_storage) - 1
        if id(value) not in self._sp_nodep:
            tracked = as_trackable(value)
            if tracked is not None:
                self._sp_handle_deferred(str(index), tracked)

    def extend(self, values: Iterable[Any]) -> None:
        for value in list(values):
            self.append(value)

    def __iadd__(self, values: Iterable[Any]) -> ListWrapper:  # type: ignore[misc]  # += keeps the wrapper, + gives a list
        self.extend(values)
        return self

    def __imul__(self, n: SupportsIndex) -> ListWrapper:
        count = operator.index(n)
        if count <= 0:
            self._sp_mutate(lambda s: s.clear(), "__imul__")
            return self
        self.extend(list(self._sp_storage) * (count - 1))
        return self

    # -- other mutations --------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, slice):
            value = [_unwrap_element(v, self._sp_nodep) for v in value]
        else:
            value = _unwrap_element(value, self._sp_nodep)

        def op(s: list) -> None:
            s[key] = value

        # TF's names: slice assignment is `__setslice__` (Python 2's hook)
        method = "__setslice__" if isinstance(key, slice) else "__setitem__"
        self._sp_mutate(op, method)
        if not isinstance(key, slice) and as_trackable(value) is not None:
            self._sp_mark_mutated(method)

    def __delitem__(self, key: Any) -> None:
        def op(s: list) -> None:
            del s[key]

        self._sp_mutate(op, "__delslice__" if isinstance(key, slice) else "__delitem__")

    def insert(self, index: SupportsIndex, value: Any) -> None:
        value = _unwrap_element(value, self._sp_nodep)
        self._sp_mutate(lambda s: s.insert(index, value), "insert")

    def pop(self, index: SupportsIndex = -1) -> Any:
        return self._sp_mutate(lambda s: s.pop(index), "pop")

    def remove(self, value: Any) -> None:
        self._sp_mutate(lambda s: s.remove(value), "remove")

    def clear(self) -> None:
        self._sp_mutate(lambda s: s.clear(), "clear")

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        self._sp_mutate(lambda s: s.sort(key=key, reverse=reverse), "sort")

    def reverse(self) -> None:
        self._sp_mutate(lambda s: s.reverse(), "reverse")

    # -- reads (always through the shared storage) -----------------------------------------
    def __getitem__(self, key: Any) -> Any:
        return self._sp_storage[key]

    def __len__(self) -> int:
        return len(self._sp_storage)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._sp_storage)

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._sp_storage)

    def __contains__(self, value: object) -> bool:
        return value in self._sp_storage

    # Every operator reads the shared storage (a wrapped wrapper: its storage), and returns
    # NotImplemented / raises exactly where a plain list would (``[1] < (1,)``, ``[] + ()``).
    def __eq__(self, other: object) -> Any:
        return self._sp_storage.__eq__(_plain(other))

    def __ne__(self, other: object) -> Any:
        return self._sp_storage.__ne__(_plain(other))

    def __lt__(self, other: Any) -> Any:
        return self._sp_storage.__lt__(_plain(other))

    def __le__(self, other: Any) -> Any:
        return self._sp_storage.__le__(_plain(other))

    def __gt__(self, other: Any) -> Any:
        return self._sp_storage.__gt__(_plain(other))

    def __ge__(self, other: Any) -> Any:
        return self._sp_storage.__ge__(_plain(other))

    def __add__(self, other: Any) -> list:
        return self._sp_storage + _plain(other)

    def __radd__(self, other: Any) -> list:
        return _plain(other) + self._sp_storage

    def __mul__(self, n: SupportsIndex) -> list:
        return self._sp_storage * n

    __rmul__ = __mul__
    __hash__ = None  # unhashable like list (DS-01)

    def __sizeof__(self) -> int:
        return self._sp_storage.__sizeof__()

    def index(self, value: Any, *args: Any) -> int:
        return self._sp_storage.index(value, *args)

    def count(self, value: Any) -> int:
        return self._sp_storage.count(value)

    def copy(self) -> list:
        return list(self._sp_storage)

    def __repr__(self) -> str:
        return f"ListWrapper({self._sp_storage!r})"

    def __copy__(self) -> ListWrapper:
        new = ListWrapper(_copy.copy(self._sp_storage))
        new._sp_dirty, new._sp_dirty_method = self._sp_dirty, self._sp_dirty_method
        return new

    def __deepcopy__(self, memo: dict) -> ListWrapper:
        new = ListWrapper(_copy.deepcopy(self._sp_storage, memo))
        new._sp_dirty, new._sp_dirty_method = self._sp_dirty, self._sp_dirty_method
        return new

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        # as TensorFlow's: a pickle holds the plain contents and loads as a fresh wrapper
        return (ListWrapper, (list(self._sp_storage),))


class DictWrapper(Trackable, dict):
    """A dict whose trackable values under string keys are dependencies named by the key."""

    def __init__(self, wrapped: Any = None, /, **kwargs: Any) -> None:
        # like dict(): a mapping (shared, DS-02), or key/value pairs and keywords (a new dict)
        storage = {} if wrapped is None else wrapped
        if not isinstance(storage, dict):
            storage = dict(storage)
        if kwargs:
            storage.update(kwargs)
        self._sp_storage: dict = storage
        self._sp_nodep: set[int] = set()
        self._sp_dirty: str | None = None
        for key, value in list(storage.items()):
            storage[key] = _unwrap_element(value, self._sp_nodep)
        self._sp_sync()

    def _sp_sync(self) -> None:
        dict.clear(self)
        dict.update(self, self._sp_storage)
        self._sp_snapshot = dict(self._sp_storage)

    def _sp_tracked(self, value: Any) -> Trackable | None:
        if id(value) in self._sp_nodep:
            return None
        return as_trackable(value)

    def _sp_check_external(self) -> None:
        if self._sp_dirty:
            return
        snap, cur = self._sp_snapshot, self._sp_storage
        if snap.keys() != cur.keys() or any(snap[k] is not cur[k] for k in cur):
            values = list(snap.values()) + list(cur.values())
            if any(self._sp_tracked(v) is not None for v in values):
                self._sp_dirty = "external"

    # -- trackable protocol ----------------------------------------------------------------
    def _sp_children(self) -> Mapping[str, Trackable]:
        out: dict[str, Trackable] = {}
        for key, value in self._sp_storage.items():
            if isinstance(key, str):
                tracked = self._sp_tracked(value)
                if tracked is not None:
                    out[key] = tracked
        return out

    def _sp_lookup(self, name: str) -> Trackable | None:
        if name not in self._sp_storage:
            return None
        return self._sp_tracked(self._sp_storage[name])

    def _sp_check_saveable(self) -> None:
        self._sp_check_external()
        if self._sp_dirty == "external":
            raise UnsaveableObjectError(
                f"Unable to save the object {self!r} (a dictionary wrapper constructed "
                "automatically on attribute assignment). The wrapped dictionary was modified "
                f"outside the wrapper (its final value was {self._sp_storage!r}, its value when "
                f"last seen by the wrapper was {self._sp_snapshot!r}), which breaks restoration "
                "on object creation.\n\nIf you don't need this dictionary checkpointed, wrap it "
                "in NoDependency; it will be ignored."
            )
        for key, value in self._sp_storage.items():
            if not isinstance(key, str) and (
                self._sp_tracked(value) is not None or isinstance(value, list | dict)
            ):
                raise UnsaveableObjectError(
                    f"Unable to save the object {self!r} (a dictionary wrapper constructed "
                    "automatically on attribute assignment). The wrapped dictionary contains a "
                    f"non-string key ({key!r}) which maps to a trackable object or mutable data "
                    "structure. Checkpoint names are strings: use string keys, or wrap the "
                    "dictionary in NoDependency if you don't need it checkpointed."
                )

    # -- mutations -------------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        self._sp_check_external()
        value = _unwrap_element(value, self._sp_nodep)
        self._sp_storage[key] = value
        self._sp_sync()
        if isinstance(key, str):
            tracked = self._sp_tracked(value)
            if tracked is not None:
                self._sp_handle_deferred(key, tracked)

    def __delitem__(self, key: Any) -> None:
        self._sp_check_external()
        del self._sp_storage[key]
        self._sp_sync()

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        for key, value in dict(other, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> DictWrapper:  # |= keeps the wrapper, | gives a dict
        self.update(other)
        return self

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self._sp_storage:
            self[key] = default
        return self._sp_storage[key]

    def pop(self, key: Any, *default: Any) -> Any:
        self._sp_check_external()
        value = self._sp_storage.pop(key, *default)
        self._sp_sync()
        return value

    def popitem(self) -> tuple[Any, Any]:
        self._sp_check_external()
        item = self._sp_storage.popitem()
        self._sp_sync()
        return item

    def clear(self) -> None:
        self._sp_check_external()
        self._sp_storage.clear()
        self._sp_sync()

    # -- reads -------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        return self._sp_storage[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._sp_storage.get(key, default)

    def __len__(self) -> int:
        return len(self._sp_storage)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._sp_storage)

    def __contains__(self, key: object) -> bool:
        return key in self._sp_storage

    def keys(self):
        return self._sp_storage.keys()

    def values(self):
        return self._sp_storage.values()

    def items(self):
        return self._sp_storage.items()

    def copy(self) -> dict:
        return dict(self._sp_storage)

    def __eq__(self, other: object) -> Any:
        return self._sp_storage.__eq__(_plain(other))

    def __ne__(self, other: object) -> Any:
        return self._sp_storage.__ne__(_plain(other))

    __hash__ = None

    def __repr__(self) -> str:
        return f"DictWrapper({self._sp_storage!r})"

    def __copy__(self) -> DictWrapper:
        new = DictWrapper(_copy.copy(self._sp_storage))
        new._sp_dirty = self._sp_dirty
        return new

    def __deepcopy__(self, memo: dict) -> DictWrapper:
        new = DictWrapper(_copy.deepcopy(self._sp_storage, memo))
        new._sp_dirty = self._sp_dirty
        return new

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        # as TensorFlow's: a pickle holds the plain contents and loads as a fresh wrapper
        return (DictWrapper, (dict(self._sp_storage),))

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._sp_storage)

    def __or__(self, other: Any) -> Any:
        return self._sp_storage.__or__(_plain(other))

    def __ror__(self, other: Any) -> Any:
        return _plain(other).__or__(self._sp_storage) if isinstance(other, dict) else NotImplemented

    def __sizeof__(self) -> int:
        return self._sp_storage.__sizeof__()

    @classmethod
    def fromkeys(cls, iterable: Iterable[Any], value: Any = None) -> DictWrapper:
        """A wrapper of ``dict.fromkeys(iterable, value)``."""
        return cls(dict.fromkeys(iterable, value))


_NAMEDTUPLE_WRAPPERS: dict[type, type] = {}


class _TupleTracking(Trackable):
    """Trackable behaviour of wrapped tuples (mixed into tuple subclasses)."""

    _sp_is_tuple_wrapper = True

    def _sp_children(self) -> Mapping[str, Trackable]:
        nodep = self.__dict__.get("_sp_nodep", set())
        out: dict[str, Trackable] = {}
        fields = getattr(type(self), "_fields", ())
        own = cast("tuple[Any, ...]", self)  # only ever mixed into tuple subclasses
        pairs = [(f, tuple.__getitem__(own, i)) for i, f in enumerate(fields)]
        pairs += [(str(i), e) for i, e in enumerate(tuple.__iter__(own))]
        for name, element in pairs:
            if id(element) in nodep:
                continue
            tracked = as_trackable(element)
            if tracked is not None:
                out[name] = tracked
        return out

    def _sp_lookup(self, name: str) -> Trackable | None:
        return self._sp_children().get(name)

    def __copy__(self) -> _TupleTracking:
        return self

    def __deepcopy__(self, memo: dict) -> Any:
        # rebuild with the original (named)tuple class so the copy is wrapped the same way
        kind = next(
            b
            for b in type(self).__mro__
            if issubclass(b, tuple) and not issubclass(b, _TupleTracking)
        )
        elements = _copy.deepcopy(list(tuple.__iter__(cast("tuple[Any, ...]", self))), memo)
        return TupleWrapper.wrap(tuple.__new__(kind, elements))


class TupleWrapper(_TupleTracking, tuple):
    """An immutable tuple whose trackable elements are dependencies named by index.

    Namedtuples are wrapped in a subclass of their own class (so ``isinstance`` and field access
    keep working) and their elements are tracked by field name as well as by index; field names
    are declared first, so breadth-first naming saves them under the field name (``nt/x``).
    """

    @classmethod
    def wrap(cls, value: tuple) -> Any:
        """Wrap ``value`` (a tuple or namedtuple), wrapping its elements recursively."""
        nodep: set[int] = set()
        elements = [_unwrap_element(e, nodep) for e in value]
        kind = type(value)
        target: type = cls
        if kind is not tuple:
            cached = _NAMEDTUPLE_WRAPPERS.get(kind)
            if cached is None:
                name = f"TupleWrapper[{kind.__name__}]"
                try:
                    cached = type(name, (cls, kind), {})
                except TypeError:  # the subclass has its own __dict__: lay-out conflict
                    cached = type(name, (kind, _TupleTracking), {})
                _NAMEDTUPLE_WRAPPERS[kind] = cached
            target = cached
        new: Any = tuple.__new__(target, elements)
        object.__setattr__(new, "_sp_nodep", nodep)
        return new
