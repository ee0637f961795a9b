"""Encoding one value to the bytes of an entry and back (FORMAT.md §6): arrays as tensors
(little-endian, C order), typed non-tensor values (bytes, str, int, float, JSON), and other
Python objects as declarative object entries (``objects``, FORMAT.md §6.1). Never pickle.
Also the key rules shared by every writer and reader."""

from __future__ import annotations

import enum
import json
import re
from typing import Any

import numpy as np

from ..errors import (
    CheckpointError,
    CorruptCheckpointError,
    InvalidArgumentError,
    InvalidKeyError,
    UnsupportedDTypeError,
)
from .dtypes import carrier_dtype, format_name, numpy_dtype
from .objects import decode_object, encode_object, is_odd_nan, is_plain_json

__all__ = [
    "check_key",
    "check_user_key",
    "RESERVED_KEY_PREFIX",
    "encode",
    "decode",
    "decode_value",
    "json_depth",
]

_FLOAT_RE = re.compile(r"^-?(inf|nan|\d+(\.\d*)?([eE][-+]?\d+)?)$")
_INT_RE = re.compile(r"^-?(\d+|0x[0-9a-f]+)$")
_JSON_MAX_DEPTH = 128
_LITTLE = np.little_endian


def check_key(key: object) -> str:
    """A storable key: a non-empty str of at most 65535 UTF-8 bytes without NUL."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"keys must be str, got {type(key).__name__}: {key!r}")
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidKeyError(f"key {key!r} is not valid Unicode (lone surrogate): {e}") from e
    if n == 0 or n > 65535:
        raise InvalidKeyError(f"key {key[:40]!r}: length {n} bytes is outside 1..=65535")
    if "\0" in key:
        raise InvalidKeyError(f"key {key!r} contains a NUL character")
    return key


#: Keys beginning with this character (U+FDD0, a Unicode noncharacter: "for internal use") are
#: the library's own (FORMAT.md §2.1, §11: delta payloads). Writers refuse them in user trees, so
#: no user key collides with one, and a reader that does not know them finds no user key there.
RESERVED_KEY_PREFIX = "\ufdd0"


def check_user_key(key: object, *, internal: bool = False) -> str:
    """:func:`check_key`, also refusing keys under :data:`RESERVED_KEY_PREFIX` (unless
    ``internal``: the library's own writers)."""
    k = check_key(key)
    if not internal and k.startswith(RESERVED_KEY_PREFIX):
        raise InvalidKeyError(
            f"key {k!r} begins with U+FDD0, reserved for shardpoint's own entries (FORMAT.md §11)"
        )
    return k


def _int_text(v: int) -> str:
    """Decimal, or ``0x`` hex past Python's decimal conversion limit (FORMAT.md §6)."""
    try:
        return str(v)
    except ValueError:  # more than sys.get_int_max_str_digits() digits
        return ("-" if v < 0 else "") + hex(abs(v))


#: What JSON nests in: objects and arrays (tuples, for metadata built in Python); the exact
#: types and JSON's scalars are told apart by a set lookup (subclasses by ``isinstance``).
_NESTED = (dict, list, tuple)
_NESTED_TYPES = frozenset(_NESTED)
_SCALAR_TYPES = frozenset((str, int, float, bool, type(None)))


def json_depth(v: Any, depth: int = 0) -> int:
    """The deepest nesting of ``v`` (a parsed JSON value) below ``depth``; raises
    :class:`InvalidArgumentError` past ``_JSON_MAX_DEPTH`` levels (a hostile index nested
    deep enough would exhaust the stack of any recursive reader of it).

    Iterative, one step per container, types looked up in sets: the recursive version, a
    generator and two ``isinstance`` per value, took 33 ms on a 20,000-tensor checkpoint's
    metadata, three times its JSON parse; this one 11 ms."""
    if depth > _JSON_MAX_DEPTH:
        raise InvalidArgumentError(f"JSON value nested deeper than {_JSON_MAX_DEPTH} levels")
    deepest = depth
    todo = [(v, depth)] if isinstance(v, _NESTED) else []
    while todo:
        x, d = todo.pop()
        items = x.values() if isinstance(x, dict) else x
        if not items:
            continue
        d += 1  # the depth of x's elements
        if d > _JSON_MAX_DEPTH:
            raise InvalidArgumentError(f"JSON value nested deeper than {_JSON_MAX_DEPTH} levels")
        if d > deepest:
            deepest = d
        for y in items:
            t = type(y)
            if t in _NESTED_TYPES or (t not in _SCALAR_TYPES and isinstance(y, _NESTED)):
                todo.append((y, d))
    return deepest


def encode(key: str, value: Any) -> tuple[str, str, str, tuple[int, ...], np.ndarray]:
    """(key, dtype name, kind, shape, 1-d uint8 array of the bytes) for one value."""
    if isinstance(value, np.ndarray):
        arr = value
        try:
            name = format_name(arr.dtype)
        except UnsupportedDTypeError as e:
            raise UnsupportedDTypeError(f"key {key!r}: {e}") from None
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _LITTLE):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        shape = arr.shape  # np.ascontiguousarray turns 0-d into 1-d: keep the real shape
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return key, name, "tensor", shape, arr.reshape(-1).view(np.uint8)
    if isinstance(value, (np.generic, enum.Enum, type, bytearray)):
        # numpy scalars come back as numpy scalars of their dtype, enum members as members,
        # classes as the allow-listed class they name (objects.py), a bytearray as a bytearray
        # (a bytes entry would read back as bytes)
        kind, raw = "object", encode_object(key, value)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        kind, raw = "bytes", bytes(value)
    elif isinstance(value, str):
        try:
            kind, raw = "str", value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(
                f"value of key {key!r} is not valid Unicode (lone surrogate), cannot be UTF-8: {e}"
            ) from e
    elif isinstance(value, bool) or value is None:
        kind, raw = "json", json.dumps(value).encode()
    elif isinstance(value, int):
        kind, raw = "int", _int_text(value).encode()
    elif isinstance(value, float) and is_odd_nan(value):
        kind, raw = "object", encode_object(key, float(value))  # repr() drops the payload
    elif isinstance(value, float):
        kind, raw = "float", repr(value).encode()
    elif isinstance(value, (dict, list, tuple)) and not is_plain_json(value):
        kind, raw = "object", encode_object(key, value)
    elif isinstance(value, (dict, list, tuple)):
        json_depth(value)
        try:
            kind, raw = "json", json.dumps(value, allow_nan=True).encode()
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"value of key {key!r} is not JSON-serialisable: {e}") from e
    elif hasattr(value, "__array__") and not callable(getattr(value, "state_dict", None)):
        return encode(key, np.asarray(value))
    else:  # dataclasses, sets, datetimes, paths... or UnsupportedDTypeError naming the path
        kind, raw = "object", encode_object(key, value)
    return key, "uint8", kind, (len(raw),), np.frombuffer(raw, dtype=np.uint8)


def decode(
    key: str, dtype: str, shape: tuple[int, ...], kind: str, buf: Any, carriers: bool = False
) -> Any:
    """The value of ``key`` from its bytes ``buf``; ``carriers``: a bfloat16/float8 tensor as
    a :func:`~.dtypes.carrier_dtype` array (for torch, which needs no ``ml_dtypes``)."""
    if kind == "tensor":
        dt = carrier_dtype(dtype) if carriers else numpy_dtype(dtype)
        return np.frombuffer(buf, dtype=dt).reshape(shape)
    raw = bytes(memoryview(buf))
    if kind == "object":
        return decode_object(key, raw)
    try:
        if kind == "bytes":
            return raw
        text = raw.decode("utf-8")
        if kind == "str":
            return text
        if kind == "int":
            if not _INT_RE.match(text):
                raise ValueError(f"{text[:40]!r} is not an integer")
            neg = text.startswith("-")
            body = text[1:] if neg else text
            v = int(body, 16) if body.startswith("0x") else int(body)
            return -v if neg else v
        if kind == "float":
            if not _FLOAT_RE.match(text):
                raise ValueError(f"{text[:40]!r} is not a float")
            return float(text)
        if kind == "json":
            value = json.loads(text)
            json_depth(value)
            return value
    except (ValueError, RecursionError) as e:  # InvalidArgumentError (depth) is a ValueError
        raise CorruptCheckpointError(f"key {key!r}: stored {kind} value is invalid: {e}") from e
    raise CorruptCheckpointError(f"key {key!r}: unknown entry kind {kind!r}")


def decode_value(prefix: str, key: str, value: Any, carriers: bool = False) -> Any:
    """:func:`decode` of a value the core read from checkpoint ``prefix``; an error it raises
    (a malformed object, a type not allowed) names the checkpoint as well as the key."""
    try:
        return decode(key, value.dtype, tuple(value.shape), value.kind, value.buffer, carriers)
    except CheckpointError as e:
        # the same error naming the checkpoint, chained to what caused the original
        raise type(e)(f"checkpoint {prefix!r}: {e}") from (e.__cause__ or e)
