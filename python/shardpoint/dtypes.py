"""dtype names of the format (FORMAT.md §4) and their numpy / ml_dtypes counterparts.

numpy is the only required dependency: bfloat16 and float8 need ``ml_dtypes`` and import it
only when such a dtype is actually written or read.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from .errors import UnsupportedDTypeError

__all__ = ["FORMAT_DTYPES", "numpy_dtype", "format_name"]

_NUMPY_NAMES = {
    "bool": np.bool_,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "complex64": np.complex64,
    "complex128": np.complex128,
}
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")

#: Every dtype name the format stores, in tag order.
FORMAT_DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
)


def _ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise UnsupportedDTypeError(
            "bfloat16/float8 arrays need the 'ml_dtypes' package (pip install shardpoint[dtypes])"
        ) from e
    return ml_dtypes


@cache
def numpy_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype for a format dtype name."""
    if name in _NUMPY_NAMES:
        return np.dtype(_NUMPY_NAMES[name]).newbyteorder("<")
    if name in _ML_DTYPES:
        return np.dtype(getattr(_ml_dtypes(), name))
    raise UnsupportedDTypeError(f"unknown dtype {name!r} in checkpoint")


@cache  # dtype.name is slow (computed in Python); dtypes are hashable and few
def format_name(dt: np.dtype) -> str:
    """The format dtype name of a numpy dtype, or UnsupportedDTypeError naming it."""
    if dt.kind in "biufc" and dt.name in _NUMPY_NAMES:
        return dt.name
    if dt.kind == "V" and dt.name in _ML_DTYPES:  # ml_dtypes types are void-kind extensions
        return dt.name
    if dt.name in _ML_DTYPES:
        return dt.name
    raise UnsupportedDTypeError(
        f"dtype {dt} cannot be stored; supported: {', '.join(FORMAT_DTYPES)}"
    )
