"""Compare two checkpoints of any readable format, key by key (``shardpoint diff``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..storage.progress import progress_bar
from .base import Source, Spec

__all__ = ["Difference", "DiffResult", "diff_sources", "max_abs_diff"]

#: Elements compared per step: bounds the float64 temporaries to a few tens of MiB per tensor.
_STEP = 1 << 21


@dataclass(frozen=True)
class Difference:
    """One key present on both sides whose dtype, shape, kind or value differs."""

    key: str
    what: str  # "dtype", "shape", "kind" or "value"
    a: str
    b: str
    max_abs: float | None = (
        None  # for tensor values: the largest |a - b| (nan/inf when NaNs differ)
    )


@dataclass
class DiffResult:
    """Keys only in A, only in B, and the differences among the common keys."""

    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    #: common tensors that compare equal within ``atol``, with their max |a - b| (0 when equal)
    equal: dict[str, float] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """No key missing on either side and nothing differs."""
        return not (self.only_a or self.only_b or self.differences)


def _as_float(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    # bool, ints, float16/32/64 and the ml_dtypes floats (bfloat16, float8) all cast exactly
    # to float64 except ints above 2**53, where the difference is only approximate.
    return x.astype(np.float64)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> tuple[bool, float]:
    """(equal, max |a - b|) of two arrays of the same dtype and shape.

    Equality is exact (``==`` on the typed values) with NaN equal to NaN at the same position;
    a NaN facing a number counts as an infinite difference. Works in steps of ``_STEP``
    elements so comparing multi-GiB tensors needs no multi-GiB temporaries.
    """
    fa, fb = a.reshape(-1), b.reshape(-1)
    equal, worst = True, 0.0
    for lo in range(0, fa.size, _STEP):
        xa, xb = fa[lo : lo + _STEP], fb[lo : lo + _STEP]
        if np.array_equal(xa, xb):
            continue
        ya, yb = _as_float(xa), _as_float(xb)
        nan_a, nan_b = np.isnan(ya), np.isnan(yb)
        if np.array_equal(ya, yb) or (
            np.array_equal(nan_a, nan_b) and np.array_equal(ya[~nan_a], yb[~nan_b])
        ):
            continue  # equal up to NaN positions (array_equal treats NaN != NaN)
        equal = False
        if (nan_a != nan_b).any():
            return False, math.inf
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(ya[~nan_a] - yb[~nan_b])
        if d.size:
            m = float(np.nanmax(d)) if not np.isnan(d).all() else math.inf
            worst = max(worst, m)
    return equal, worst


def _describe(s: Spec) -> str:
    return f"{s.dtype}{list(s.shape)}" if s.kind == "tensor" else s.kind


def diff_sources(
    a: Source, b: Source, *, atol: float = 0.0, progress: bool | None = None
) -> DiffResult:
    """Key-by-key comparison; tensors differ when their max |a - b| exceeds ``atol``
    (``atol=0``: any unequal element). Values are read one key at a time."""
    sa = {s.key: s for s in a.specs()}
    sb = {s.key: s for s in b.specs()}
    res = DiffResult(only_a=[k for k in sa if k not in sb], only_b=[k for k in sb if k not in sa])
    common = [k for k in sa if k in sb]
    bar = progress_bar(sum(sa[k].nbytes for k in common), "diff", progress=progress)
    try:
        for key in common:
            x, y = sa[key], sb[key]
            for what, u, v in (("kind", x.kind, y.kind), ("dtype", x.dtype, y.dtype)):
                if u != v:
                    res.differences.append(Difference(key, what, _describe(x), _describe(y)))
                    break
            else:
                if x.shape != y.shape and x.kind == "tensor":
                    res.differences.append(Difference(key, "shape", _describe(x), _describe(y)))
                else:
                    _compare_values(res, key, a.read(key), b.read(key), atol)
            bar.update(x.nbytes)
    finally:
        bar.close()
    return res


def _compare_values(res: DiffResult, key: str, va: Any, vb: Any, atol: float) -> None:
    if isinstance(va, np.ndarray) and isinstance(vb, np.ndarray):
        equal, worst = max_abs_diff(va, vb)
        if equal or worst <= atol:
            res.equal[key] = worst
        else:
            res.differences.append(Difference(key, "value", "", "", worst))
    elif type(va) is type(vb) and va == vb:
        res.equal[key] = 0.0
    else:
        res.differences.append(Difference(key, "value", _short(va), _short(vb)))


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
