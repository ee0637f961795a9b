"""``load_into`` targets checked against their entries in one call.

Why: checking each target with its own ``info`` lookup (a record built per key, then compared
in Python) cost ~10 us per key: 20,000 values of 2 KiB loaded at 0.17 GB/s though the read
itself ran at 3-4 GB/s (benches/bench_small_values.py). Here Python only gathers each array's
dtype name, shape and byte view, and the core compares all of them with the index at once
(``first_mismatch``).

What must stay true: this is only a fast path. Anything it cannot vouch for (a key or array of
an unexpected type, a dtype with no single format name, any mismatch) makes it answer
``None``, and the caller runs its key-by-key check, which raises the same errors, naming the
key, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedDTypeError
from .dtypes import format_name, numpy_dtype
from .values import check_key

__all__ = ["checked_targets"]


def _name_of(dt: np.dtype) -> str | None:
    """The format dtype name whose numpy dtype is exactly ``dt`` (byte order included), or
    ``None`` (unsupported, or a big-endian array the key-by-key check refuses)."""
    try:
        name = format_name(dt)
        same = numpy_dtype(name) == dt
    except UnsupportedDTypeError:
        return None
    return name if same else None


def checked_targets(
    core: Any, targets: Mapping[str, Any]
) -> tuple[list[str], list[np.ndarray]] | None:
    """Keys and byte views of ``targets`` (``key -> array``) when every array is a writable,
    C-contiguous numpy array of its stored value's dtype and shape; ``None`` when anything
    is off or ``core`` has no batched check (the caller then checks key by key)."""
    match = getattr(core, "first_mismatch", None)
    if match is None:
        return None
    keys = list(targets)
    names: list[str] = []
    shapes: list[tuple[int, ...]] = []
    outs: list[np.ndarray] = []
    # by identity (builtin dtypes are shared objects; the dtype is kept so its id stays its
    # own): hashing a dtype costs more than the rest of a key's checks, and dtype hashing
    # ignores ``metadata`` (the packed-fp4 tag), which identity does not
    seen: dict[int, tuple[np.dtype, str | None]] = {}
    for arr in targets.values():
        if type(arr) is not np.ndarray:
            return None
        flags = arr.flags
        if not (flags.c_contiguous and flags.writeable):
            return None
        dt = arr.dtype
        hit = seen.get(id(dt))
        if hit is None:
            hit = seen[id(dt)] = (dt, _name_of(dt))
        name = hit[1]
        if name is None:
            return None
        names.append(name)
        shapes.append(arr.shape)
        outs.append(arr.reshape(-1).view(np.uint8))
    try:
        bad = match(keys, names, shapes)
    except (TypeError, ValueError):  # a key that is not a str (or not encodable)
        return None
    return None if bad is not None else (keys, outs)


def checked_one_by_one(
    info: Callable[[str], Any], targets: Mapping[str, np.ndarray]
) -> tuple[list[str], list[np.ndarray]]:
    """The key-by-key check (``info``: the reader's, a key's index record), raising
    ``InvalidArgumentError`` naming the first key whose target does not fit; keys and byte
    views as :func:`checked_targets` returns them."""
    keys, outs = [], []
    for key, arr in targets.items():
        rec = info(check_key(key))
        if not isinstance(arr, np.ndarray):
            raise InvalidArgumentError(
                f"key {key!r}: target must be a numpy array, not {type(arr).__name__}"
            )
        if rec.kind != "tensor":
            raise InvalidArgumentError(f"key {key!r}: stored value is a {rec.kind}, not a tensor")
        want = numpy_dtype(rec.dtype)
        if arr.dtype != want or tuple(arr.shape) != tuple(rec.shape):
            raise InvalidArgumentError(
                f"key {key!r}: target is {arr.dtype}{list(arr.shape)}, "
                f"stored value is {rec.dtype}{list(rec.shape)}"
            )
        if not (arr.flags.c_contiguous and arr.flags.writeable):
            raise InvalidArgumentError(f"key {key!r}: target must be C-contiguous and writable")
        keys.append(key)
        outs.append(arr.reshape(-1).view(np.uint8))
    return keys, outs
