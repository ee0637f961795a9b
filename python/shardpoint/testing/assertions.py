"""``assert_identical``: bit-for-bit equality of tensors and of whole trees.

Equality here is the one a checkpoint owes its user: the same container types, the same keys,
the same Python types, and for every tensor the same dtype, shape and *bits* (a NaN payload, a
NaN's sign and the sign of zero count; ``torch.testing.assert_close`` and ``==`` see none of
them). Byte order and memory layout are not part of a value: a big-endian or transposed array
equals the little-endian, C-ordered array holding the same numbers.

Nothing here needs Hypothesis, torch or jax: a framework is looked at only when a value of it
is handed in (its module is then already imported).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import struct
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["assert_identical", "tensor_bits", "is_tensor", "check"]


def check(condition: object, message: str) -> None:
    """``assert`` that ``python -O`` does not remove: the kit's checks are its purpose."""
    if not condition:
        raise AssertionError(message)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# --------------------------------------------------------------------------------------------
# tensors as little-endian element bits
# --------------------------------------------------------------------------------------------


def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _jax_array(x: Any) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a numpy array, a torch tensor or a jax array."""
    return isinstance(x, np.ndarray) or _torch_tensor(x) or _jax_array(x)


def _dtype_label(x: Any) -> str:
    if isinstance(x, np.ndarray | np.generic):
        dtype = x.dtype
        tag = (dtype.metadata or {}).get("shardpoint_dtype")
        return str(tag) if tag else dtype.newbyteorder("=").name
    return str(x.dtype)


def _type_label(x: Any) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def tensor_bits(x: Any) -> np.ndarray:
    """The elements of a numpy array / torch tensor / jax array as a C-ordered array of
    little-endian bytes, shape ``x.shape + (itemsize,)``: what a checkpoint must give back."""
    if _torch_tensor(x):
        t = x.detach()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        t = t.cpu().contiguous()
        shape = tuple(t.shape)
        size = t.element_size()
        if t.numel() == 0:  # an empty tensor may keep a stride of 0: nothing to view
            return np.zeros((*shape, size), np.uint8)
        # a fresh flat copy: a size-1 dimension may keep any stride (contiguous() and clone()
        # keep it too), which view(uint8) refuses
        flat = t.new_empty((t.numel(),))
        flat.copy_(t.reshape(-1))
        raw = flat.view(_torch_uint8()).numpy()
        return raw.reshape((*shape, size))
    a = np.asarray(x)
    size = a.dtype.itemsize
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not np.little_endian):
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.reshape(-1).view(np.uint8).reshape((*a.shape, size))


def _torch_uint8() -> Any:
    return sys.modules["torch"].uint8


def _hex(row: np.ndarray) -> str:
    """The little-endian bytes of one element as a big-endian hex number (0x7fc00000)."""
    return "0x" + bytes(row[::-1]).hex()


def _element_text(bits: np.ndarray, dtype_label: str) -> str:
    """A readable value for one element's bytes, where numpy knows the dtype."""
    try:
        from ..storage.dtypes import numpy_dtype

        dtype = numpy_dtype(dtype_label)
        if dtype.metadata:  # packed fp4: two nibbles per byte, no numeric view
            return ""
        value = np.frombuffer(bytes(bits), dtype=dtype)[0]
        return repr(value.item() if hasattr(value, "item") else value)
    except Exception:  # noqa: BLE001 - a label numpy cannot read: bits only
        return ""


# --------------------------------------------------------------------------------------------
# the walk
# --------------------------------------------------------------------------------------------


class _Mismatch(AssertionError):
    pass


def _fail(path: str, msg: str) -> None:
    raise _Mismatch(f"not identical at {path or 'the root'}: {msg}")


def _tensor_kind(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return "numpy" if type(x) is np.ndarray else _type_label(x)
    return _type_label(x)


def _compare_tensors(path: str, a: Any, b: Any) -> None:
    if type(a) is not type(b):
        _fail(path, f"expected a {_tensor_kind(a)}, got a {_tensor_kind(b)}")
    da, db = _dtype_label(a), _dtype_label(b)
    if da != db:
        _fail(path, f"dtype differs: expected {da}, got {db}")
    sa, sb = tuple(a.shape), tuple(b.shape)
    if sa != sb:
        _fail(path, f"shape differs: expected {sa}, got {sb} ({da})")
    if _torch_tensor(a) and a.device != b.device:
        _fail(path, f"device differs: expected {a.device}, got {b.device}")
    ba, bb = tensor_bits(a), tensor_bits(b)
    if ba.shape != bb.shape:  # same dtype name, other itemsize: cannot happen, but say so
        _fail(path, f"element size differs: {ba.shape[-1]} vs {bb.shape[-1]} bytes")
    rows_a = ba.reshape(-1, ba.shape[-1]) if ba.size else ba.reshape(0, max(1, ba.shape[-1]))
    rows_b = bb.reshape(-1, bb.shape[-1]) if bb.size else bb.reshape(0, max(1, bb.shape[-1]))
    diff = np.flatnonzero((rows_a != rows_b).any(axis=1)) if rows_a.size else np.array([])
    if diff.size:
        first = int(diff[0])
        index = tuple(int(i) for i in np.unravel_index(first, sa)) if sa else ()
        ea, eb = rows_a[first], rows_b[first]
        va, vb = _element_text(ea, da), _element_text(eb, db)
        values = f" (expected {va}, got {vb})" if va and vb else ""
        _fail(
            path,
            f"{da} tensor of shape {sa}: first difference at index {index}: expected bits "
            f"{_hex(ea)}, got {_hex(eb)}{values}; {diff.size} of {rows_a.shape[0]} elements "
            "differ",
        )


def _float_bits(x: float) -> str:
    return "0x" + struct.pack(">d", x).hex()


def _compare_scalars(path: str, a: Any, b: Any) -> bool:
    """Compare two values of one exact type that are not containers; False if not a scalar."""
    t = type(a)
    if t is float:
        if struct.pack("<d", a) != struct.pack("<d", b):
            _fail(
                path,
                f"float differs: expected {a!r} ({_float_bits(a)}), got {b!r} ({_float_bits(b)})",
            )
        return True
    if t is complex:
        for part in ("real", "imag"):
            pa, pb = getattr(a, part), getattr(b, part)
            if struct.pack("<d", pa) != struct.pack("<d", pb):
                _fail(
                    path,
                    f"complex {part} part differs: expected {pa!r} ({_float_bits(pa)}), got "
                    f"{pb!r} ({_float_bits(pb)})",
                )
        return True
    if isinstance(a, np.generic):
        if _dtype_label(a) != _dtype_label(b):
            _fail(path, f"numpy scalar dtype differs: {_dtype_label(a)} vs {_dtype_label(b)}")
        ba, bb = tensor_bits(np.asarray(a)), tensor_bits(np.asarray(b))
        if ba.tobytes() != bb.tobytes():
            _fail(
                path,
                f"{_dtype_label(a)} scalar differs: expected {a!r} (bits {_hex(ba)}), got {b!r} "
                f"(bits {_hex(bb)})",
            )
        return True
    if t in (int, bool, str, bytes, bytearray, type(None)) or isinstance(a, enum.Enum):
        if a != b or (isinstance(a, enum.Enum) and a is not b):
            _fail(path, f"{_type_label(a)} differs: expected {_short(a)}, got {_short(b)}")
        return True
    if isinstance(a, decimal.Decimal):
        if a.as_tuple() != b.as_tuple():
            _fail(path, f"Decimal differs: expected {a!r}, got {b!r}")
        return True
    if isinstance(a, dt.datetime | dt.time):
        # == ignores the time zone of aware values that name the same instant, and fold
        if (a.isoformat(), a.fold) != (b.isoformat(), b.fold):
            _fail(path, f"{_type_label(a)} differs: expected {a.isoformat()}, got {b.isoformat()}")
        return True
    return False


def _short(x: Any, limit: int = 120) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_text(k: Any) -> str:
    return f"[{k!r}]"


def _fields(x: Any) -> dict[str, Any] | None:
    """Named parts of a dataclass / namespace / namedtuple, compared one by one."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: getattr(x, f.name) for f in dataclasses.fields(x) if hasattr(x, f.name)}
    if isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple):
        return {f: getattr(x, f) for f in type(x)._fields}  # type: ignore[attr-defined]  # a namedtuple
    import argparse
    import types

    if isinstance(x, argparse.Namespace | types.SimpleNamespace):
        return dict(vars(x))
    return None


class _Walker:
    def __init__(self) -> None:
        self.active: set[tuple[int, int]] = set()  # pairs on the current path (cycles)

    def walk(self, path: str, a: Any, b: Any) -> None:
        if type(a) is not type(b):
            _fail(
                path,
                f"type differs: expected {_type_label(a)} {_short(a, 60)}, got "
                f"{_type_label(b)} {_short(b, 60)}",
            )
        if is_tensor(a):
            _compare_tensors(path, a, b)
            return
        if _compare_scalars(path, a, b):
            return
        pair = (id(a), id(b))
        if pair in self.active:
            return  # a cycle already being compared on this path
        self.active.add(pair)
        try:
            self.container(path, a, b)
        finally:
            self.active.discard(pair)

    def container(self, path: str, a: Any, b: Any) -> None:
        fields = _fields(a)
        if fields is not None:
            other = _fields(b) or {}
            if list(fields) != list(other):
                _fail(path, f"fields differ: expected {list(fields)}, got {list(other)}")
            for name, value in fields.items():
                self.walk(f"{path}.{name}", value, other[name])
            return
        if isinstance(a, Mapping):
            ka, kb = list(a.keys()), list(b.keys())
            missing = [k for k in ka if k not in b]
            extra = [k for k in kb if k not in a]
            if missing or extra:
                _fail(
                    path,
                    f"keys differ: missing {_short(missing)}, unexpected {_short(extra)}",
                )
            for k in ka:
                self.walk(f"{path}{_key_text(k)}", a[k], b[k])
            return
        if isinstance(a, list | tuple):
            if len(a) != len(b):
                _fail(path, f"{_type_label(a)} length differs: expected {len(a)}, got {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                self.walk(f"{path}[{i}]", x, y)
            return
        if isinstance(a, set | frozenset):
            if a != b:
                _fail(path, f"{_type_label(a)} differs: expected {_short(a)}, got {_short(b)}")
            return
        self.opaque(path, a, b)

    def opaque(self, path: str, a: Any, b: Any) -> None:
        """Other objects (paths, UUIDs, dates, torch.dtype, registered user types): ``==``."""
        try:
            same = a == b
            if not isinstance(same, bool | np.bool_):
                same = bool(same)
        except Exception as e:  # noqa: BLE001 - an __eq__ that cannot answer
            _fail(path, f"cannot compare {_type_label(a)} values: {e!r}")
        if not same:
            _fail(path, f"{_type_label(a)} differs: expected {_short(a)}, got {_short(b)}")


# --------------------------------------------------------------------------------------------
# aliasing
# --------------------------------------------------------------------------------------------


def _tensor_leaves(
    tree: Any, path: str = "", seen: set[int] | None = None
) -> Iterator[tuple[str, Any]]:
    seen = set() if seen is None else seen
    if is_tensor(tree):
        yield path, tree
        return
    if id(tree) in seen:
        return
    if isinstance(tree, Mapping):
        seen.add(id(tree))
        for k, v in tree.items():
            yield from _tensor_leaves(v, f"{path}{_key_text(k)}", seen)
    elif isinstance(tree, list | tuple):
        seen.add(id(tree))
        for i, v in enumerate(tree):
            yield from _tensor_leaves(v, f"{path}[{i}]", seen)
    else:
        fields = _fields(tree)
        if fields:
            seen.add(id(tree))
            for k, v in fields.items():
                yield from _tensor_leaves(v, f"{path}.{k}", seen)


def _memory(x: Any) -> tuple[int, int] | None:
    """``(start, end)`` addresses of a tensor's elements, or None if it holds none."""
    if _torch_tensor(x):
        if x.numel() == 0 or x.device.type == "meta":
            return None
        start = x.data_ptr()
        last = sum((n - 1) * abs(s) for n, s in zip(x.shape, x.stride(), strict=True))
        return start, start + (last + 1) * x.element_size()
    return None  # numpy pairs go through np.shares_memory; jax arrays are immutable


def _numel(x: Any) -> int:
    return int(x.numel()) if _torch_tensor(x) else int(np.prod(x.shape))


def _shares(x: Any, y: Any) -> bool:
    if x is y:
        return True
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
        return bool(np.shares_memory(x, y)) if x.size and y.size else False
    mx, my = _memory(x), _memory(y)
    return mx is not None and my is not None and mx[0] < my[1] and my[0] < mx[1]


def _alias_pairs(leaves: list[tuple[str, Any]]) -> dict[tuple[str, str], str]:
    # an empty tensor holds no memory: tying it to another is not observable through values
    leaves = [(p, x) for p, x in leaves if _numel(x)]
    out: dict[tuple[str, str], str] = {}
    for i, (pa, xa) in enumerate(leaves):
        for pb, xb in leaves[i + 1 :]:
            if xa is xb:
                out[(pa, pb)] = "the same object"
            elif _shares(xa, xb):
                out[(pa, pb)] = "views of shared memory"
    return out


def _check_aliasing(expected: Any, actual: Any) -> None:
    want = _alias_pairs(list(_tensor_leaves(expected)))
    got = _alias_pairs(list(_tensor_leaves(actual)))
    # a restored alias may be another object viewing the same memory: still an alias
    for pair, how in want.items():
        if pair not in got:
            _fail(pair[1], f"aliasing lost: expected {how} as {pair[0]}, got a separate tensor")
    for pair, how in got.items():
        if pair not in want:
            _fail(pair[1], f"unexpected aliasing: {how} as {pair[0]}, expected separate tensors")


# --------------------------------------------------------------------------------------------
# the public function
# --------------------------------------------------------------------------------------------


def assert_identical(expected: Any, actual: Any, *, check_aliasing: bool = False) -> None:
    """Raise ``AssertionError`` unless ``actual`` is bit-for-bit ``expected``.

    Trees (dicts and other mappings, lists, tuples, dataclasses, named tuples, namespaces) must
    have the same types and keys (mapping order is not compared); tensors (numpy, torch, jax)
    the same type, dtype, shape, device and element bits (byte order and strides are not part
    of a value); Python floats and numpy scalars the same bits; other values the same type and
    ``==``. With ``check_aliasing``, tensors that are one object or share memory in
    ``expected`` must share memory in ``actual`` and the other way round (tied weights;
    empty tensors hold no memory and are not counted).

    The message names the path inside the tree (``['opt']['m'][0]``), and for tensors the
    first differing index and both elements' bits in hex.
    """
    __tracebackhide__ = True
    try:
        _Walker().walk("", expected, actual)
        if check_aliasing:
            _check_aliasing(expected, actual)
    except _Mismatch as e:
        raise AssertionError(str(e)) from None
