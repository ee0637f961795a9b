"""The handlers of the built-in tags of object entries (FORMAT.md §6.1): the standard library
(tuple, set, frozenset, dict with non-str keys, complex, bytes, decimal, datetime and friends,
uuid, paths, argparse.Namespace...) and numpy (scalars, small arrays). Always allowed; registered
when this module is imported."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import math
import pathlib
import struct
import types
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import (
    UnsupportedDTypeError,
)
from .dtypes import format_name, numpy_dtype
from .object_types import _CLASS_OF_TAG, _HANDLER_OF_TYPE, _HANDLERS, _Handler, _Members

# --------------------------------------------------------------------------------------------
# Built-in tags
# --------------------------------------------------------------------------------------------


_CANONICAL_NAN = struct.pack("<d", math.nan)


def is_odd_nan(value: float) -> bool:
    """Whether ``value`` is a NaN that JSON's ``NaN`` would not give back bit for bit (another
    payload or sign than Python's ``float("nan")``): stored with the ``float`` tag."""
    return value != value and struct.pack("<d", value) != _CANONICAL_NAN


def float_hex(v: float) -> str:
    """The ``float`` tag's payload: ``0x`` and the 16 hex digits of the IEEE 754 bits."""
    return "0x" + struct.pack(">d", v).hex()


def _builtin(tag: str, classes: tuple[type, ...], encode: Any, decode: Any) -> _Handler:
    h = _Handler(tag, encode, decode)
    _HANDLERS[tag] = h
    for cls in classes:
        _HANDLER_OF_TYPE[cls] = h
    if classes:
        _CLASS_OF_TAG[tag] = classes[0]
    return h


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _seq(payload: Any, child: Callable[[Any, str], Any]) -> list[Any]:
    _expect(isinstance(payload, list) and not isinstance(payload, _Members), "expected a list")
    return [child(v, f"[{i}]") for i, v in enumerate(payload)]


def _sorted_if_possible(values: Iterable[Any]) -> list[Any]:
    """Set elements in a stable order (sorted when comparable), so equal sets give equal
    files whatever the hash seed."""
    items = list(values)
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=lambda v: (type(v).__qualname__, repr(v)))


def _str_payload(payload: Any) -> str:
    _expect(isinstance(payload, str), "expected a string")
    return str(payload)


def _decode_str_dict(payload: Any, child: Callable[[Any, str], Any]) -> dict[str, Any]:
    _expect(isinstance(payload, _Members), "expected a JSON object")
    out: dict[str, Any] = {}
    for k, v in payload:
        _expect(k not in out, f"repeated key {k!r}")
        out[k] = child(v, f"[{k!r}]")
    return out


def _decode_map(payload: Any, child: Callable[[Any, str], Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for i, pair in enumerate(_raw_list(payload)):
        _expect(
            isinstance(pair, list) and not isinstance(pair, _Members) and len(pair) == 2,
            "map items must be [key, value] pairs",
        )
        out[child(pair[0], f"<key {i}>")] = child(pair[1], f"[{i}]")
    return out


def _raw_list(payload: Any) -> list[Any]:
    _expect(isinstance(payload, list) and not isinstance(payload, _Members), "expected a list")
    return list(payload)


def _register_builtins() -> None:
    _builtin("dict", (), None, _decode_str_dict)  # encoded by _Encoder.mapping
    _builtin("map", (), None, _decode_map)
    _builtin(
        "tuple",
        (tuple,),
        lambda v, c: [c(x, f"[{i}]") for i, x in enumerate(v)],
        lambda p, c: tuple(_seq(p, c)),
    )
    _builtin(
        "set",
        (set,),
        lambda v, c: [c(x, f"<{i}>") for i, x in enumerate(_sorted_if_possible(v))],
        lambda p, c: set(_seq(p, c)),
    )
    _builtin(
        "frozenset",
        (frozenset,),
        lambda v, c: [c(x, f"<{i}>") for i, x in enumerate(_sorted_if_possible(v))],
        lambda p, c: frozenset(_seq(p, c)),
    )
    _builtin(
        "bytes",
        (bytes,),
        lambda v, c: base64.b64encode(v).decode(),
        lambda p, c: base64.b64decode(_str_payload(p), validate=True),
    )
    _builtin(
        "bytearray",
        (bytearray,),
        lambda v, c: base64.b64encode(v).decode(),
        lambda p, c: bytearray(base64.b64decode(_str_payload(p), validate=True)),
    )
    _builtin("int", (), None, lambda p, c: _parse_int(_str_payload(p)))
    _builtin("float", (), None, _decode_float)
    _builtin(
        "complex",
        (complex,),
        lambda v, c: [c(v.real, ".real"), c(v.imag, ".imag")],
        _decode_complex,
    )
    _builtin("datetime.datetime", (dt.datetime,), _encode_wall_time, _decode_datetime)
    _builtin(
        "datetime.date",
        (dt.date,),
        lambda v, c: v.isoformat(),
        lambda p, c: dt.date.fromisoformat(_str_payload(p)),
    )
    _builtin("datetime.time", (dt.time,), _encode_wall_time, _decode_time)
    _builtin(
        "datetime.timedelta",
        (dt.timedelta,),
        lambda v, c: [v.days, v.seconds, v.microseconds],
        _decode_timedelta,
    )
    _builtin("datetime.timezone", (dt.timezone,), _encode_timezone, _decode_timezone)
    _builtin(
        "pathlib.Path",
        (pathlib.PosixPath, pathlib.WindowsPath),
        lambda v, c: str(v),
        lambda p, c: pathlib.Path(_str_payload(p)),
    )
    _builtin(
        "pathlib.PurePosixPath",
        (pathlib.PurePosixPath,),
        lambda v, c: str(v),
        lambda p, c: pathlib.PurePosixPath(_str_payload(p)),
    )
    _builtin(
        "pathlib.PureWindowsPath",
        (pathlib.PureWindowsPath,),
        lambda v, c: str(v),
        lambda p, c: pathlib.PureWindowsPath(_str_payload(p)),
    )
    _builtin(
        "argparse.Namespace",
        (argparse.Namespace,),
        lambda v, c: {k: c(x, f".{k}") for k, x in vars(v).items()},
        lambda p, c: argparse.Namespace(**_decode_str_dict(p, c)),
    )
    _builtin(
        "types.SimpleNamespace",
        (types.SimpleNamespace,),
        lambda v, c: {k: c(x, f".{k}") for k, x in vars(v).items()},
        lambda p, c: types.SimpleNamespace(**_decode_str_dict(p, c)),
    )
    _builtin(
        "decimal.Decimal",
        (decimal.Decimal,),
        lambda v, c: str(v),
        lambda p, c: decimal.Decimal(_str_payload(p)),
    )
    _builtin(
        "uuid.UUID", (uuid.UUID,), lambda v, c: str(v), lambda p, c: uuid.UUID(_str_payload(p))
    )
    _builtin("numpy.scalar", (), _encode_np_scalar, _decode_np_scalar)
    _builtin("numpy.ndarray", (), _encode_np_array, _decode_np_array)


def _parse_int(text: str) -> int:
    neg = text.startswith("-")
    body = text[1:] if neg else text
    _expect(body.startswith("0x") and len(body) > 2, "big integers are written as 0x hex")
    v = int(body[2:], 16)
    return -v if neg else v


def _decode_float(p: Any, c: Any) -> float:
    """A float given by its IEEE 754 bits (NaNs with a payload or sign of their own)."""
    text = _str_payload(p)
    _expect(len(text) == 18 and text.startswith("0x"), "expected 0x and 16 hex digits")
    return float(struct.unpack(">d", bytes.fromhex(text[2:]))[0])  # bad hex: ValueError


def _decode_complex(p: Any, c: Any) -> complex:
    _expect(isinstance(p, list) and len(p) == 2, "expected [real, imag]")
    re_, im = c(p[0], ".real"), c(p[1], ".imag")
    _expect(all(type(x) in (int, float) for x in (re_, im)), "expected numbers")
    return complex(re_, im)


def _encode_wall_time(v: dt.datetime | dt.time, c: Any) -> Any:
    """ISO 8601 text; ``[text, 1]`` for the second of two equal wall times (``fold=1``),
    which the text does not carry."""
    return [v.isoformat(), 1] if v.fold else v.isoformat()


def _wall_time(p: Any) -> tuple[str, int]:
    if isinstance(p, list) and not isinstance(p, _Members):
        _expect(len(p) == 2 and p[1] in (0, 1) and type(p[1]) is int, "expected [iso text, fold]")
        return _str_payload(p[0]), int(p[1])
    return _str_payload(p), 0


def _decode_datetime(p: Any, c: Any) -> dt.datetime:
    text, fold = _wall_time(p)
    return dt.datetime.fromisoformat(text).replace(fold=fold)


def _decode_time(p: Any, c: Any) -> dt.time:
    text, fold = _wall_time(p)
    return dt.time.fromisoformat(text).replace(fold=fold)


def _decode_timedelta(p: Any, c: Any) -> dt.timedelta:
    _expect(
        isinstance(p, list) and len(p) == 3 and all(type(x) is int for x in p),
        "expected [days, seconds, microseconds]",
    )
    return dt.timedelta(days=p[0], seconds=p[1], microseconds=p[2])


def _encode_timezone(v: dt.timezone, c: Any) -> Any:
    off = v.utcoffset(None)
    return [off.days * 86400 + off.seconds, off.microseconds]


def _decode_timezone(p: Any, c: Any) -> dt.timezone:
    _expect(
        isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p),
        "expected [seconds, microseconds]",
    )
    return dt.timezone(dt.timedelta(seconds=p[0], microseconds=p[1]))


def _le(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _encode_np_scalar(v: np.generic, c: Any) -> Any:
    arr = np.asarray(v)
    name = format_name(arr.dtype)
    return [name, arr.astype(_le(arr.dtype)).tobytes().hex()]


def _decode_np_scalar(p: Any, c: Any) -> Any:
    _expect(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p),
        "expected [dtype, hex bytes]",
    )
    dtype = _dtype(p[0])
    raw = bytes.fromhex(p[1])
    _expect(len(raw) == dtype.itemsize, f"{len(raw)} bytes for a {p[0]} scalar")
    return np.frombuffer(raw, dtype=dtype)[0]


def _encode_np_array(v: np.ndarray, c: Any) -> Any:
    name = format_name(v.dtype)
    data = np.ascontiguousarray(v.astype(_le(v.dtype), copy=False)).tobytes()
    return [name, list(v.shape), base64.b64encode(data).decode()]


def _decode_np_array(p: Any, c: Any) -> np.ndarray:
    _expect(isinstance(p, list) and len(p) == 3, "expected [dtype, shape, base64 bytes]")
    name, shape, text = p
    _expect(isinstance(name, str) and isinstance(text, str), "expected [dtype, shape, bytes]")
    _expect(
        isinstance(shape, list)
        and len(shape) <= 64
        and all(type(n) is int and n >= 0 for n in shape),
        "bad shape",
    )
    dtype = _dtype(name)
    raw = base64.b64decode(text, validate=True)  # bounded by the entry's own size
    _expect(
        len(raw) == math.prod(shape) * dtype.itemsize,
        f"{len(raw)} bytes for a {name} array of shape {shape}",
    )
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _dtype(name: str) -> np.dtype:
    try:
        return numpy_dtype(name)
    except UnsupportedDTypeError as e:
        raise ValueError(str(e)) from None


def _no_payload(value: Any, child: Any) -> Any:
    raise AssertionError("a marker handler is never asked for a payload")  # pragma: no cover


# markers of _Encoder.fallback_handler: a Mapping or list subclass (stored as a dict or list)
# and a str/int/float subclass (stored as its base value), as JSON entries store them
_MAPPING = _Handler("dict", _no_payload, _no_payload)
_LIST = _Handler("list", _no_payload, _no_payload)
_BASE_VALUE = _Handler("", _no_payload, _no_payload)

_register_builtins()
