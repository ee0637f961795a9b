"""Bit-level helpers of delta entries: XOR of two values' bit patterns, byte equality, crc32c.

Every dtype is handled as its bytes: a value's bit pattern is its little-endian bytes (what the
format stores, FORMAT.md §4), so NaN payloads, ``-0.0``, bfloat16/float8/float4 codes and
complex values need no special case, and ``a ^ (a ^ b) == b`` holds bit for bit. The XOR runs on
the widest unsigned view the byte count allows (numpy's loop is memory bound there).
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError

__all__ = ["byte_view", "xor_into", "xor_bytes", "same_bytes", "crc32c"]


def byte_view(arr: np.ndarray, *, writable: bool = False) -> np.ndarray:
    """The bytes of a C-contiguous array as a 1-d uint8 view (no copy)."""
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError("delta values must be C-contiguous arrays")
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError("the target of a delta must be writable")
    return arr.reshape(-1).view(np.uint8)


def _wide(b: np.ndarray) -> np.ndarray:
    """``b`` (1-d uint8) as uint64 when its length and address allow: 8x fewer loop steps."""
    if b.size % 8 == 0:
        w = b.view(np.uint64)
        if w.flags.aligned:  # (``ctypes.data`` would cost ~20 us a call: a ctypes object)
            return w
    return b


def xor_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst ^= src`` on two 1-d uint8 arrays of one length (in place)."""
    if dst.shape != src.shape:
        raise InvalidArgumentError(f"xor of {dst.size} bytes with {src.size} bytes")
    d, s = _wide(dst), _wide(src)
    if d.dtype != s.dtype:
        d, s = dst, src
    np.bitwise_xor(d, s, out=d)


def xor_bytes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a ^ b`` of two 1-d uint8 arrays of one length, as a fresh 1-d uint8 array."""
    if a.shape != b.shape:
        raise InvalidArgumentError(f"xor of {a.size} bytes with {b.size} bytes")
    out = np.empty_like(a)
    wa, wb, wo = _wide(a), _wide(b), _wide(out)
    if wa.dtype == wb.dtype == wo.dtype:
        np.bitwise_xor(wa, wb, out=wo)
    else:
        np.bitwise_xor(a, b, out=out)
    return out


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two 1-d uint8 arrays hold the same bytes (bit equality, not float equality:
    NaN == NaN, 0.0 != -0.0)."""
    if a.shape != b.shape:
        return False
    wa, wb = _wide(a), _wide(b)
    if wa.dtype != wb.dtype:
        wa, wb = a, b
    return bool(np.array_equal(wa, wb))


def crc32c(b: np.ndarray) -> int:
    """crc32c of a 1-d uint8 array (the core's hardware crc, the checksum entries carry)."""
    return int(_core.crc32c(b))
