"""Python objects as declarative entries, never pickled (FORMAT.md §6.1).

An ``object`` entry holds a UTF-8 JSON document ``{"v": 1, "value": NODE}`` describing a tree
of values. JSON scalars (``null``, ``true``, numbers, strings) and arrays (lists) stand for
themselves; every other value is a JSON object with exactly one member, ``{TAG: PAYLOAD}``.
A tag names a *handler*, never an importable path:

- built-in tags for the standard library and numpy (``tuple``, ``dict``, ``set``,
  ``datetime.datetime``, ``argparse.Namespace``, ``numpy.scalar``...), always allowed;
- tags of shardpoint's own layers (``torch.Size``, ``torch.dtype``, ``torch.device`` from
  ``shardpoint.torch``; ``omegaconf.DictConfig``/``ListConfig`` when omegaconf is installed),
  whose handlers live with their framework and register themselves: this module never
  imports a framework (the package declares which of its modules provides which tags);
- four generic tags for user types, ``dataclass``, ``enum``, ``namedtuple`` and ``object``,
  whose payload starts with the name the type is registered under.

Saving describes any dataclass, ``Enum`` member or named tuple without help; other classes
need :func:`register_type` with ``encode``/``decode``. Loading builds a user type only when it
is registered (the allow-list, as ``torch.serialization.add_safe_globals`` keeps one): a type
name read from a file is looked up in the registry, never imported. Hostile payloads are
bounded: at most :data:`MAX_OBJECT_BYTES` bytes of JSON, :data:`MAX_DEPTH` levels of nesting,
and every malformed node is a ``CorruptCheckpointError`` naming the key and the node's path.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import (
    CheckpointError,
    CorruptCheckpointError,
    InvalidArgumentError,
    UnregisteredTypeError,
    UnsupportedDTypeError,
)
from .object_builtins import _BASE_VALUE, _LIST, _MAPPING, float_hex, is_odd_nan
from .object_types import (
    _CLASS_OF_TAG,
    _DECLARED,
    _HANDLER_OF_TYPE,
    _HANDLERS,
    _PLAIN_CLASSES,
    _USER_BY_CLASS,
    _default_name,
    _Handler,
    _import_declared,
    _is_namedtuple_class,
    _Members,
    add_safe_types,
    allowed_class_named,
    allowed_type_named,
    declare_tags,
    register_tag,
    register_type,
    registered_types,
    safe_types,
    warn_if_not_loadable,
)

__all__ = [
    "register_type",
    "add_safe_types",
    "safe_types",
    "registered_types",
    "encode_object",
    "decode_object",
    "has_handler",
    "is_plain_json",
    "is_odd_nan",
    "register_tag",
    "declare_tags",
    "MAX_DEPTH",
    "MAX_OBJECT_BYTES",
]

#: Version of the object document (the ``"v"`` member); readers refuse newer ones.
OBJECT_VERSION = 1
#: Deepest nesting of nodes, on save and on load (as for JSON entries).
MAX_DEPTH = 128
#: Largest object document, on save and on load: parsing JSON costs memory proportional to
#: its size (tens of bytes per node), so a hostile entry must not be able to ask for more.
MAX_OBJECT_BYTES = 64 << 20

_USER_TAGS = ("dataclass", "enum", "namedtuple", "object")
_REGISTER_HINT = (
    "register it with shardpoint.register_type({cls}) (dataclasses, Enum and named tuples "
    "need nothing else; other classes also give encode=/decode= functions to and from "
    "storable values); shardpoint never pickles"
)


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _path_text(where: str, path: str) -> str:
    return f"key {where!r}" + (f" at {path}" if path else "")


def is_plain_json(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` round-trips exactly through a plain JSON entry: dicts with str keys,
    lists, str, int, float (not a NaN with a payload of its own), bool, None, and nothing else
    (no tuples, which JSON would turn into lists, no numpy scalars, enums or other subclasses
    that JSON would silently turn into base types)."""
    if depth > MAX_DEPTH:
        return False
    t = type(value)
    if value is None or t in (str, int, bool):
        return True
    if t is float:
        return not is_odd_nan(value)
    if t is list:
        return all(is_plain_json(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) is str and is_plain_json(v, depth + 1) for k, v in value.items())
    return False


def has_handler(value: Any) -> bool:
    """Whether ``value`` is an object this module describes by a type of its own (rather than
    as structure a caller may flatten): anything but plain dicts, lists, tuples and scalars."""
    t = type(value)
    if t in (dict, list, tuple, str, int, float, bool, type(None), bytes):
        return False
    if t in _HANDLER_OF_TYPE or t in _USER_BY_CLASS:
        return True
    if isinstance(value, (np.generic, enum.Enum)) or _is_namedtuple_class(t):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return True
    pkg = t.__module__.split(".")[0]
    return any(p == pkg for _, p, _ in _DECLARED) and pkg not in ("torch",)


class _Encoder:
    def __init__(self, where: str) -> None:
        self.where = where
        self.nodes = 0
        self.active: set[int] = set()  # ids of the containers on the current path (cycles)

    def fail(self, path: str, msg: str, cls: type[CheckpointError] = InvalidArgumentError) -> Any:
        raise cls(f"{_path_text(self.where, path)}: {msg}")

    def node(self, value: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            self.fail(path, f"value nested deeper than {MAX_DEPTH} levels")
        t = type(value)
        if value is None or t is str or t is bool:
            return value
        if t is int:
            return value if -(1 << 63) <= value < (1 << 64) else {"int": _int_text(value)}
        if t is float:
            return {"float": float_hex(value)} if is_odd_nan(value) else value
        if t is list:
            return self.container(value, path, depth, lambda: self.items(value, path, depth))
        if t is dict:
            return self.container(value, path, depth, lambda: self.mapping(value, path, depth))
        if isinstance(value, type):
            return {"type": self.class_name(value, path)}
        handler = _HANDLER_OF_TYPE.get(t)
        if handler is None and t not in _USER_BY_CLASS:
            handler = self.fallback_handler(value, t, path)
        if handler is _LIST:
            return self.container(value, path, depth, lambda: self.items(value, path, depth))
        if handler is _MAPPING:
            return self.container(value, path, depth, lambda: self.mapping(value, path, depth))
        if handler is _BASE_VALUE:
            base = next(b for b in (str, int, float) if isinstance(value, b))
            return self.node(base(value), path, depth)
        if handler is not None:
            return self.container(
                value, path, depth, lambda: {handler.tag: self.payload(handler, value, path, depth)}
            )
        return self.container(value, path, depth, lambda: self.user(value, t, path, depth))

    def fallback_handler(self, value: Any, t: type, path: str) -> _Handler | None:
        """The handler of a type without an exact one; ``None`` for user types."""
        if isinstance(value, np.generic):
            return _HANDLERS["numpy.scalar"]
        if isinstance(value, np.ndarray):
            return _HANDLERS["numpy.ndarray"]
        if isinstance(value, enum.Enum) or _is_namedtuple_class(t):
            return None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return None
        pkg = t.__module__.split(".")[0]
        if _import_declared(package=pkg) and t in _HANDLER_OF_TYPE:
            return _HANDLER_OF_TYPE[t]
        # subclasses of the structural built-ins keep their content, as in JSON entries
        for base in (tuple, bytes, bytearray, set, frozenset):
            if isinstance(value, base):
                return _HANDLER_OF_TYPE[base]
        if isinstance(value, list):
            return _LIST
        if isinstance(value, Mapping):
            return _MAPPING
        if isinstance(value, (str, int, float)):  # str/int/float subclasses: their base value
            return _BASE_VALUE
        what = "tensors" if hasattr(value, "__array__") else None
        hint = (
            "store arrays and tensors as entries of their own, not inside an object"
            if what
            else _REGISTER_HINT.format(cls=t.__qualname__)
        )
        return self.fail(
            path,
            f"value of type {t.__module__}.{t.__qualname__} cannot be stored; {hint}",
            UnsupportedDTypeError,
        )

    def class_name(self, cls: type, path: str) -> str:
        """The name a class is stored under as a value (Lightning's ``hparams_type`` is the
        OmegaConf config class): a name the allow-list already knows it by, never a path
        that a reader would import."""
        for name, plain in _PLAIN_CLASSES.items():
            if plain is cls:
                return name
        entry = _USER_BY_CLASS.get(cls)
        if entry is not None:
            return entry.name
        if cls not in _HANDLER_OF_TYPE:
            _import_declared(package=cls.__module__.split(".")[0])
        handler = _HANDLER_OF_TYPE.get(cls)
        if handler is not None and _CLASS_OF_TAG.get(handler.tag) is cls:
            return handler.tag
        return self.fail(
            path,
            f"the class {cls.__module__}.{cls.__qualname__} cannot be stored as a value: only "
            "built-in value types, the classes shardpoint has a tag for (tuple, "
            "argparse.Namespace, omegaconf.DictConfig...) and registered types can; "
            + _REGISTER_HINT.format(cls=cls.__qualname__),
            UnsupportedDTypeError,
        )

    def container(self, value: Any, path: str, depth: int, build: Callable[[], Any]) -> Any:
        self.nodes += 1
        if self.nodes > MAX_OBJECT_BYTES // 2:
            self.fail(path, "object has too many nodes to store")
        vid = id(value)
        if vid in self.active:
            self.fail(
                path, "the value contains itself (a reference cycle); cycles cannot be stored"
            )
        self.active.add(vid)
        try:
            return build()
        finally:
            self.active.discard(vid)

    def mapping(self, value: Mapping[Any, Any], path: str, depth: int) -> Any:
        """``{"dict": {...}}`` when every key is a str, else ``{"map": [[k, v], ...]}``."""
        if all(type(k) is str for k in value):
            return {
                "dict": {k: self.node(v, f"{path}[{k!r}]", depth + 1) for k, v in value.items()}
            }
        return {
            "map": [
                [
                    self.node(k, f"{path}<key {i}>", depth + 1),
                    self.node(v, f"{path}[{k!r}]", depth + 1),
                ]
                for i, (k, v) in enumerate(value.items())
            ]
        }

    def items(self, seq: Iterable[Any], path: str, depth: int) -> list[Any]:
        return [self.node(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(seq)]

    def payload(self, handler: _Handler, value: Any, path: str, depth: int) -> Any:
        def child(v: Any, suffix: str) -> Any:
            return self.node(v, path + suffix, depth + 1)

        try:
            return handler.encode(value, child)
        except UnsupportedDTypeError as e:
            if self.where in str(e):
                raise
            return self.fail(path, str(e), UnsupportedDTypeError)
        except CheckpointError:
            raise
        except (TypeError, ValueError, OverflowError) as e:
            return self.fail(path, f"cannot store {handler.tag} value: {e}")

    def user(self, value: Any, t: type, path: str, depth: int) -> Any:
        entry = _USER_BY_CLASS.get(t)
        name = entry.name if entry is not None else _default_name(t)
        if entry is None:
            warn_if_not_loadable(t)

        def child(v: Any, suffix: str) -> Any:
            return self.node(v, path + suffix, depth + 1)

        if entry is not None and entry.encode is not None:
            try:
                state = entry.encode(value)
            except CheckpointError:
                raise
            except Exception as e:
                return self.fail(path, f"encode function of {name} failed: {e!r}")
            return {"object": [name, child(state, "")]}
        if isinstance(value, enum.Enum):
            members = type(value).__members__
            member = value.name if value.name and members.get(value.name) is value else None
            ref: Any = member if member is not None else {"value": child(value.value, ".value")}
            return {"enum": [name, ref]}
        if _is_namedtuple_class(t):
            fields = {f: child(getattr(value, f), f".{f}") for f in t._fields}  # type: ignore[attr-defined]  # a named-tuple class (checked above)
            return {"namedtuple": [name, fields]}
        fields = {
            f.name: child(getattr(value, f.name), f".{f.name}")
            for f in dataclasses.fields(value)
            if hasattr(value, f.name)
        }
        return {"dataclass": [name, fields]}


def _int_text(v: int) -> str:
    return ("-" if v < 0 else "") + hex(abs(v))


def encode_object(where: str, value: Any) -> bytes:
    """The UTF-8 JSON document of an ``object`` entry for ``value`` (``where``: the key, for
    messages). Raises before anything is written: ``UnsupportedDTypeError`` naming the path
    of a value nothing can describe (and how to register its type), ``InvalidArgumentError``
    for cycles, too deep or too large trees."""
    node = _Encoder(where).node(value, "", 0)
    text = json.dumps(
        {"v": OBJECT_VERSION, "value": node},
        allow_nan=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"key {where!r}: a string is not valid Unicode: {e}") from e
    if len(raw) > MAX_OBJECT_BYTES:
        raise InvalidArgumentError(
            f"key {where!r}: object is {len(raw)} bytes as JSON, over the {MAX_OBJECT_BYTES} "
            "bytes allowed; store large data as arrays"
        )
    return raw


# --------------------------------------------------------------------------------------------
# Decoding (hostile input)
# --------------------------------------------------------------------------------------------


class _Decoder:
    def __init__(self, where: str) -> None:
        self.where = where

    def corrupt(self, path: str, msg: str) -> Any:
        raise CorruptCheckpointError(f"{_path_text(self.where, path)}: stored object {msg}")

    def node(self, x: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            self.corrupt(path, f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, _Members):
            if len(x) != 1:
                self.corrupt(path, f"node has {len(x)} members, expected one {{tag: payload}}")
            tag, payload = x[0]
            return self.tagged(tag, payload, path, depth)
        if isinstance(x, list):
            return [self.node(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
        return x  # JSON scalar

    def tagged(self, tag: str, payload: Any, path: str, depth: int) -> Any:
        def child(v: Any, suffix: str) -> Any:
            return self.node(v, path + suffix, depth + 1)

        if tag in _USER_TAGS:
            return self.user(tag, payload, path, child)
        if tag == "type":
            return self.class_ref(payload, path)
        handler = _HANDLERS.get(tag)
        if handler is None and _import_declared(tag=tag):
            handler = _HANDLERS.get(tag)
        if handler is None:
            self.corrupt(path, f"has unknown type tag {tag[:80]!r}")
        try:
            return handler.decode(payload, child)  # type: ignore[union-attr]  # corrupt() raised if None
        except (CheckpointError, MemoryError):
            raise
        except Exception as e:  # whatever the type's constructor raises on a bad payload
            # (decimal.InvalidOperation is an ArithmeticError, not a ValueError): the file's
            # fault, so shardpoint's error naming the key, the cause chained for a reader
            raise CorruptCheckpointError(
                f"{_path_text(self.where, path)}: stored object of tag {tag!r} is malformed: "
                f"{type(e).__name__}: {e}"
            ) from e

    def user(self, tag: str, payload: Any, path: str, child: Callable[[Any, str], Any]) -> Any:
        if not (isinstance(payload, list) and len(payload) == 2 and isinstance(payload[0], str)):
            self.corrupt(path, f"of tag {tag!r} must be [type name, state]")
        name, state = payload
        entry = allowed_type_named(name)
        if entry is None:
            raise UnregisteredTypeError(
                f"{_path_text(self.where, path)}: type {name[:200]!r} is not registered "
                f"(torch.load's words: Unsupported global: GLOBAL {name[:200]}), so it is not "
                "built (shardpoint builds only allow-listed types and never imports a name a "
                "file gives); call shardpoint.register_type(<that class>) or "
                "shardpoint.add_safe_types([...]) (or torch.serialization.add_safe_globals) "
                "before loading"
            )
        if entry.tag != tag:
            self.corrupt(path, f"says {tag} but {name!r} is registered as a {entry.tag}")
        cls = entry.cls
        try:
            if tag == "object":
                assert entry.decode is not None
                return entry.decode(child(state, ""))
            if tag == "enum":
                if isinstance(state, str):
                    return cls[state]  # type: ignore[index]  # an Enum class: the tag says so
                if isinstance(state, _Members) and len(state) == 1 and state[0][0] == "value":
                    return cls(child(state[0][1], ".value"))
                return self.corrupt(path, "enum member must be a name or {'value': node}")
            if not isinstance(state, _Members):
                return self.corrupt(path, f"{tag} fields must be a JSON object")
            values = self.fields(state, path, child)
            if tag == "namedtuple":
                return cls(**values)
            return self.dataclass(cls, values, path)
        except CheckpointError:
            raise
        except Exception as e:  # the user's own code (decode, __init__, __post_init__)
            return self.corrupt(path, f"could not be rebuilt as {name!r}: {e!r}")

    def class_ref(self, name: Any, path: str) -> type:
        """The class a ``type`` node names: looked up in the allow-list, never imported."""
        if not isinstance(name, str):
            return self.corrupt(path, "of tag 'type' must be a class name")
        cls = _PLAIN_CLASSES.get(name)
        if cls is None:
            cls = allowed_class_named(name)
        if cls is None and name not in _CLASS_OF_TAG:
            _import_declared(tag=name)
        cls = cls or _CLASS_OF_TAG.get(name)
        if cls is None:
            raise UnregisteredTypeError(
                f"{_path_text(self.where, path)}: class {name[:200]!r} is not registered "
                f"(torch.load's words: Unsupported global: GLOBAL {name[:200]}), so it is not "
                "looked up (shardpoint never imports a name a file gives); call "
                "shardpoint.register_type(<that class>) before loading"
            )
        return cls

    def fields(self, members: _Members, path: str, child: Callable[[Any, str], Any]) -> dict:
        out: dict[str, Any] = {}
        for k, v in members:
            if k in out:
                self.corrupt(path, f"repeats field {k!r}")
            out[k] = child(v, f".{k}")
        return out

    def dataclass(self, cls: type, values: dict[str, Any], path: str) -> Any:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            self.corrupt(path, f"has fields {unknown} that {cls.__qualname__} does not declare")
        init = {k: v for k, v in values.items() if fields[k].init}
        obj = cls(**init)
        for k, v in values.items():
            if not fields[k].init:
                object.__setattr__(obj, k, v)  # frozen dataclasses too
        return obj


def decode_object(where: str, raw: bytes) -> Any:
    """Build the value of an ``object`` entry (``where``: the key, for messages)."""
    if len(raw) > MAX_OBJECT_BYTES:
        raise CorruptCheckpointError(
            f"key {where!r}: stored object is {len(raw)} bytes, over the {MAX_OBJECT_BYTES} "
            "bytes a reader accepts"
        )
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_Members)
    except (ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"key {where!r}: stored object is not valid JSON: {e}") from e
    if not isinstance(doc, _Members):
        raise CorruptCheckpointError(f"key {where!r}: stored object is not a JSON object")
    top = dict(doc)
    version = top.get("v")
    if type(version) is not int or "value" not in top:
        raise CorruptCheckpointError(f"key {where!r}: stored object lacks its version or value")
    if version > OBJECT_VERSION:
        raise CorruptCheckpointError(
            f"key {where!r}: stored object has version {version}; this shardpoint reads "
            f"version {OBJECT_VERSION} (upgrade shardpoint)"
        )
    try:
        return _Decoder(where).node(top["value"], "", 0)
    except (CheckpointError, MemoryError):
        raise
    except Exception as e:  # the decode boundary: nothing foreign escapes (chained, not hidden)
        raise CorruptCheckpointError(
            f"key {where!r}: stored object could not be decoded: {type(e).__name__}: {e}"
        ) from e
