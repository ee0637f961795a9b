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
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import (
    InvalidArgumentError,
    UnregisteredTypeWarning,
)

__all__ = [
    "register_type",
    "add_safe_types",
    "safe_types",
    "registered_types",
    "register_tag",
    "declare_tags",
    "allowed_type_named",
    "allowed_class_named",
    "warn_if_not_loadable",
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


def _field_tag(cls: type) -> str | None:
    """The user tag of a class described by its fields or members, without functions."""
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    if issubclass(cls, enum.Enum):
        return "enum"
    if _is_namedtuple_class(cls):
        return "namedtuple"
    return None


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
    tag = "object" if encode is not None else _field_tag(cls)
    if tag is None:
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


def _torch_allowed() -> dict[str, type]:
    """The classes the user allowed for ``torch.load(weights_only=True)``
    (``torch.serialization.add_safe_globals`` or its ``safe_globals`` context), by the name
    a file records them under. Read at each use, so torch's scoped context is honoured; only
    when torch is imported already: allowing a type for torch means torch is in use, and
    importing torch to find out would cost a second or more of every load."""
    ser = sys.modules.get("torch.serialization")
    get = getattr(ser, "get_safe_globals", None)
    if get is None:
        return {}
    try:
        items = list(get())
    except Exception:  # a torch without the list, or one changed under us: nothing allowed
        return {}
    out: dict[str, type] = {}
    for item in items:
        # an entry is a class, or (class, "module.Name") naming where a file finds it
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], type):
            cls, name = item
            if isinstance(name, str):
                out[name] = cls
            out.setdefault(_default_name(cls), cls)
        elif isinstance(item, type):
            out.setdefault(_default_name(item), item)
    return out


def allowed_type_named(name: str) -> _UserType | None:
    """The allow-list entry a load builds ``name`` with: a registered type, else a
    dataclass, Enum or named tuple allowed for torch's loads (our allow-list is the user's
    allow-list, however they gave it); ``None`` when neither."""
    entry = _USER_BY_NAME.get(name)
    if entry is not None:
        return entry
    cls = _torch_allowed().get(name)
    tag = None if cls is None else _field_tag(cls)
    return None if cls is None or tag is None else _UserType(cls, name, tag)


def allowed_class_named(name: str) -> type | None:
    """A class a ``type`` node may name: registered, or allowed for torch's loads."""
    entry = _USER_BY_NAME.get(name)
    return entry.cls if entry is not None else _torch_allowed().get(name)


_WARNED: set[type] = set()


def warn_if_not_loadable(cls: type) -> None:
    """Warn once per class per process when a save stores an instance of ``cls`` that no load
    builds without the user allowing it first: better said at save time than found at resume
    time, in another process, hours later."""
    if cls in _USER_BY_CLASS or cls in _WARNED:
        return
    if cls in _torch_allowed().values():
        return
    with _LOCK:
        if cls in _WARNED:
            return
        _WARNED.add(cls)
    what = cls.__qualname__
    # point at the user's save call, however deep inside shardpoint the object was met
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"shardpoint: saved an object of type {_default_name(cls)}, which is not on the "
        f"allow-list: a load will refuse to build it (UnregisteredTypeError) until the loading "
        f"process calls shardpoint.add_safe_types([{what}]) (or "
        f"torch.serialization.add_safe_globals([{what}])); this is said once per type",
        UnregisteredTypeWarning,
        stacklevel=level,
    )


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
