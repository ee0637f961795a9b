"""dtype names of the format (FORMAT.md §4) and their numpy / ml_dtypes counterparts.

numpy is the only required dependency: bfloat16 and float8 need ``ml_dtypes`` and import it
only when such a dtype is actually written or read.

``float4_e2m1fn_x2`` (torch's two packed 4-bit floats per byte) has no numpy or ml_dtypes type:
on the numpy side it is a ``uint8`` array whose dtype carries the format name in its
``metadata`` (:data:`PACKED_FP4`), so it round-trips through ``load_file``/``save_file``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..errors import UnsupportedDTypeError

__all__ = [
    "FORMAT_DTYPES",
    "PACKED_FP4",
    "MAX_SHAPE_BYTES",
    "numpy_dtype",
    "carrier_dtype",
    "typed",
    "format_name",
    "safetensors_name",
    "shape_problem",
]

#: Largest dimension, and largest byte size of a shape's non-zero dimensions, that numpy (and
#: the Rust core, whose index check is the same) can represent: ``2^63 - 1`` (``npy_intp``).
MAX_SHAPE_BYTES = 2**63 - 1

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
_ML_DTYPES = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)
_PACKED_FP4_NAME = "float4_e2m1fn_x2"
#: numpy dtype of ``float4_e2m1fn_x2`` arrays: one byte per element, tagged in ``metadata``
PACKED_FP4 = np.dtype(np.uint8, metadata={"shardpoint_dtype": _PACKED_FP4_NAME})

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
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    _PACKED_FP4_NAME,
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
    if name == _PACKED_FP4_NAME:
        return PACKED_FP4
    raise UnsupportedDTypeError(f"unknown dtype {name!r} in checkpoint")


@cache
def carrier_dtype(name: str) -> np.dtype:
    """:func:`numpy_dtype`, except that a type numpy has only through ``ml_dtypes`` (bfloat16,
    float8) is a same-width integer dtype tagged with its name in ``metadata``, as
    :data:`PACKED_FP4` is. For readers whose consumer is torch (which views the bytes as its
    own dtype): importing ``ml_dtypes`` 0.7 takes ~0.8 s (its extension registers every
    type's ufunc loops), paid by every fresh process that loads a bfloat16 checkpoint."""
    if name in _ML_DTYPES:
        base = np.int16 if name == "bfloat16" else np.uint8
        return np.dtype(base, metadata={"shardpoint_dtype": name})
    return numpy_dtype(name)


def typed(array: Any) -> Any:
    """``array`` with its real numpy dtype when it is a :func:`carrier_dtype` array (a view);
    anything else unchanged."""
    meta = array.dtype.metadata if isinstance(array, np.ndarray) else None
    tag = meta.get("shardpoint_dtype") if meta else None
    if tag in _ML_DTYPES:
        return array.view(numpy_dtype(tag))
    return array


def format_name(dt: np.dtype) -> str:
    """The format dtype name of a numpy dtype, or UnsupportedDTypeError naming it."""
    # dtype equality and hashing ignore ``metadata``: the packed-fp4 and carrier tags are read
    # before the cache, which would otherwise confuse them with plain integers
    if dt.metadata is not None:
        tag = dt.metadata.get("shardpoint_dtype")
        if tag == _PACKED_FP4_NAME or tag in _ML_DTYPES:
            return str(tag)
    return _format_name(dt)


@cache  # dtype.name is slow (computed in Python); dtypes are hashable and few
def _format_name(dt: np.dtype) -> str:
    if dt.kind in "biufc" and dt.name in _NUMPY_NAMES:
        return dt.name
    if dt.kind == "V" and dt.name in _ML_DTYPES:  # ml_dtypes types are void-kind extensions
        return dt.name
    if dt.name in _ML_DTYPES:
        return dt.name
    raise UnsupportedDTypeError(
        f"dtype {dt} cannot be stored; supported: {', '.join(FORMAT_DTYPES)}"
    )


# safetensors' dtype tags for our names; complex128 and the packed fp4 pair have none there
# (safetensors' "F4" counts 4-bit elements, ours counts bytes), so they keep a tag of our own.
_SAFETENSORS = {
    "bool": "BOOL",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
    "complex128": "C128",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    _PACKED_FP4_NAME: "F4_X2",
}


def safetensors_name(name: str) -> str:
    """safetensors' dtype tag (``"F32"``, ``"BF16"``...) for a format dtype name."""
    try:
        return _SAFETENSORS[name]
    except KeyError:
        raise UnsupportedDTypeError(f"unknown dtype {name!r}") from None


def shape_problem(shape: Any, bits: int) -> str | None:
    """Why no array can have ``shape`` with elements of ``bits`` bits, or ``None`` if it can.

    numpy refuses a dimension above ``2^63 - 1`` and non-zero dimensions whose byte size is
    above it, *even when another dimension is 0* (``[0, 2^64 - 1]`` holds no bytes, yet
    ``np.empty`` raises ``ValueError``), so a file declaring such a shape is damaged or hostile.
    The product is capped as it grows: a hostile shape cannot make a huge number.
    """
    nbytes_bits = bits
    for d in shape:
        if d > MAX_SHAPE_BYTES:
            return f"dimension {d} exceeds 2^63 - 1"
        if d:
            nbytes_bits *= d
            if nbytes_bits > 8 * MAX_SHAPE_BYTES:
                return "its non-zero dimensions hold more than 2^63 - 1 bytes"
    return None
