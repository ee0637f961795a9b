"""The allow-list of Python types an object entry may hold (FORMAT.md §6.1), and the handlers
of tags: user types registered with :func:`register_type` (dataclasses, enums, named tuples,
classes with ``encode``/``decode``), and the handlers of built-in and framework tags
(:func:`register_tag`; the tags of shardpoint's framework layers are declared by
``shardpoint/__init__`` with :func:`declare_tags` and imported when needed). A loader builds a
type only when it is registered here: a name read from a file is looked up, never imported."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import (
    InvalidArgumentError,
)

__all__ = [
    "register_type",
    "add_safe_types",
    "safe_types",
    "registered_types",
    "register_tag",
    "declare_tags",
]

# --------------------------------------------------------------------------------------------
# The registry: user types (the allow-list) and the handlers of built-in tags
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _UserType:
    cls: type
    name: str
    tag: str  # one of _USER_TAGS
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class _Handler:
    """A built-in tag: ``encode(value, child)`` gives the payload (``child`` encodes a nested
    value), ``decode(payload, child)`` builds the value (``child`` decodes a nested node)."""

    tag: str
    encode: Callable[[Any, Callable[[Any, str], Any]], Any]
    decode: Callable[[Any, Callable[[Any, str], Any]], Any]


_LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    # A forked child has only the forking thread: a lock another thread held at the fork
    # would stay held forever (ARCHITECTURE.md, "Threads and fork").
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
_USER_BY_NAME: dict[str, _UserType] = {}
_USER_BY_CLASS: dict[type, _UserType] = {}
_HANDLERS: dict[str, _Handler] = {}  # tag -> handler
_HANDLER_OF_TYPE: dict[type, _Handler] = {}  # exact type -> handler
_CLASS_OF_TAG: dict[str, type] = {}  # tag -> the class a ``type`` node of that name stands for
#: Classes a ``type`` node names directly (value types without a tag of their own).
_PLAIN_CLASSES: dict[str, type] = {
    c.__name__: c for c in (dict, list, str, int, float, bool, type(None))
}
# Tags and types whose handlers live in another of shardpoint's modules, imported on first
# need: (module, top-level package of the types, tags).
_DECLARED: list[tuple[str, str, tuple[str, ...]]] = []


def _default_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_namedtuple_class(cls: type) -> bool:
    return issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)


def register_type(
    cls: type,
    *,
    name: str | None = None,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
) -> type:
    """Allow ``cls`` in checkpoints: saves describe its instances, loads build them.

    Dataclasses, ``Enum`` subclasses and named tuples are described by their fields (members)
    and need no functions. Any other class gives ``encode(obj) -> state`` (a storable value:
    JSON-like data, other registered objects, numpy scalars...) and ``decode(state) -> obj``.
    ``name`` is what the file records (default ``"module.QualName"``); give a stable one if
    the class may move. Registering the same class again is a no-op; another class under a
    name already taken raises ``InvalidArgumentError``. Returns ``cls`` (usable as a class
    decorator). Registration is process-wide; see :func:`safe_types` for a scoped one.
    """
    if not isinstance(cls, type):
        raise InvalidArgumentError(f"register_type expects a class, got {cls!r}")
    if (encode is None) != (decode is None):
        raise InvalidArgumentError(f"{cls.__qualname__}: give both encode= and decode=, or neither")
    if encode is not None:
        tag = "object"
    elif dataclasses.is_dataclass(cls):
        tag = "dataclass"
    elif issubclass(cls, enum.Enum):
        tag = "enum"
    elif _is_namedtuple_class(cls):
        tag = "namedtuple"
    else:
        raise InvalidArgumentError(
            f"{cls.__qualname__} is not a dataclass, Enum or named tuple: give "
            "encode=(obj -> storable state) and decode=(state -> obj)"
        )
    key = _default_name(cls) if name is None else str(name)
    if not key:
        raise InvalidArgumentError("a registered type name must not be empty")
    entry = _UserType(cls, key, tag, encode, decode)
    with _LOCK:
        old = _USER_BY_NAME.get(key)
        if old is not None and old.cls is not cls:
            raise InvalidArgumentError(
                f"type name {key!r} is already registered for {_default_name(old.cls)}; "
                "pass name= to register this class under another one"
            )
        prev = _USER_BY_CLASS.get(cls)
        if prev is not None and prev.name != key:
            _USER_BY_NAME.pop(prev.name, None)
        _USER_BY_NAME[key] = entry
        _USER_BY_CLASS[cls] = entry
    return cls


def add_safe_types(types_: Iterable[type]) -> None:
    """Register several dataclasses / Enum / named tuple classes at once (the counterpart of
    ``torch.serialization.add_safe_globals``)."""
    for cls in types_:
        register_type(cls)


def _unregister(cls: type) -> None:
    with _LOCK:
        entry = _USER_BY_CLASS.pop(cls, None)
        if entry is not None and _USER_BY_NAME.get(entry.name) is entry:
            del _USER_BY_NAME[entry.name]


@contextmanager
def safe_types(types_: Iterable[type]) -> Iterator[None]:
    """Within the ``with`` block, also allow these classes (as :func:`add_safe_types`); the
    ones not registered before are forgotten again afterwards (``torch.serialization.
    safe_globals``'s counterpart)."""
    added = []
    for cls in types_:
        if cls not in _USER_BY_CLASS:
            register_type(cls)
            added.append(cls)
    try:
        yield
    finally:
        for cls in added:
            _unregister(cls)


def registered_types() -> dict[str, type]:
    """The allow-list: registered name -> class."""
    with _LOCK:
        return {name: e.cls for name, e in _USER_BY_NAME.items()}


def register_tag(
    tag: str,
    classes: Iterable[type],
    encode: Callable[[Any, Callable[[Any, str], Any]], Any],
    decode: Callable[[Any, Callable[[Any, str], Any]], Any],
) -> None:
    """For shardpoint's own layers: handle instances of exactly ``classes`` under ``tag``
    (e.g. ``shardpoint.torch`` registers ``torch.Size``). ``encode(value, child)`` returns
    the JSON payload, calling ``child(nested_value, path_suffix)`` for nested values;
    ``decode(payload, child)`` builds the value, ``child(nested_node, path_suffix)``
    decoding nested nodes; raise ``ValueError``/``TypeError`` on a malformed payload."""
    h = _Handler(tag, encode, decode)
    classes = tuple(classes)
    with _LOCK:
        _HANDLERS[tag] = h
        for cls in classes:
            _HANDLER_OF_TYPE[cls] = h
        if classes:
            _CLASS_OF_TAG[tag] = classes[0]


def declare_tags(module: str, package: str, tags: Iterable[str]) -> None:
    """Say that ``module`` (one of shardpoint's own) registers ``tags`` for types of the
    top-level package ``package``: it is imported when a value of such a type is saved or a
    file holds one of the tags. Declared by ``shardpoint/__init__`` so that this layer
    imports no framework."""
    _DECLARED.append((module, package, tuple(tags)))


def _import_declared(*, tag: str | None = None, package: str | None = None) -> bool:
    """Import the module declared for ``tag`` or for types of ``package``; whether one was."""
    for module, pkg, tags in _DECLARED:
        if (tag is not None and tag in tags) or (package is not None and package == pkg):
            importlib.import_module(module)
            return True
    return False


class _Members(list[tuple[str, Any]]):
    """A JSON object as parsed: its members in order (duplicates kept, so they are seen)."""
