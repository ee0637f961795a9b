"""How much each tensor moved between two checkpoints (``shardpoint diff --values``).

Per common tensor: the relative L2 change ``||a - b|| / ||a||``, the largest ``|a - b|``, the
number of changed elements, and whether it is bit-identical. When both sides record the crc32c
of the tensor's raw bytes (shardpoint checkpoints do, whatever their codec or chunking) and the
crcs match, the tensor is reported identical without being read: equal crc32c of equal-length
raw bytes means identical values except with probability about 2^-32 per tensor (a collision),
which ``--values`` accepts in exchange for not decoding unchanged tensors. Everything else is
read one tensor at a time and compared in the Rust core (GIL released, float64 accumulation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import _core
from ..convert import open_source
from ..convert.base import Source, Spec
from ..convert.shardpoint_io import ShardpointSource
from ..storage.progress import progress_bar
from .health import select_keys

__all__ = ["TensorChange", "ValueDiff", "value_diff"]


@dataclass(frozen=True)
class TensorChange:
    """One tensor present on both sides with the same dtype and shape."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    #: True when every element is equal (bitwise for equal crcs; NaN equals NaN otherwise)
    identical: bool
    #: "crc" when equal recorded crc32c settled it without reading, else "values"
    decided_by: str
    #: ||a - b|| / ||a|| over positions finite on both sides (inf when ||a|| is 0 but b moved,
    #: or when a value turned NaN/Inf or back)
    rel_l2: float
    #: the largest |a - b| over positions finite on both sides (inf if finiteness changed)
    max_abs: float
    changed: int
    count: int
    #: ||a|| and ||a - b|| over positions finite on both sides (0 when decided by crc), so
    #: changes can be pooled per layer: sqrt(sum diff^2) / sqrt(sum a^2)
    norm_a: float = 0.0
    norm_diff: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """JSON-able dict (infinities as the strings "inf")."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        for k in ("rel_l2", "max_abs"):
            d[k] = "inf" if math.isinf(d[k]) else d[k]
        return d


@dataclass
class ValueDiff:
    """The result of :func:`value_diff`: changes sorted by ``rel_l2``, largest first."""

    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    #: (key, what, a, b) for keys whose kind, dtype or shape differs
    mismatched: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: non-tensor values that differ
    other_changed: list[str] = field(default_factory=list)
    tensors: list[TensorChange] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Nothing missing, mismatched or changed."""
        return not (
            self.only_a
            or self.only_b
            or self.mismatched
            or self.other_changed
            or any(not t.identical for t in self.tensors)
        )


def _recorded_crc(src: Source, key: str) -> int | None:
    if isinstance(src, ShardpointSource):
        return int(src.reader.info(key).crc32c)
    return src.expected_crc32c(key)


def _flat(x: Any) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def _compare(a: Source, b: Source, sa: Spec, sb: Spec) -> TensorChange:
    ca, cb = _recorded_crc(a, sa.key), _recorded_crc(b, sb.key)
    if ca is not None and ca == cb:
        return TensorChange(sa.key, sa.dtype, sa.shape, True, "crc", 0.0, 0.0, 0, -1)
    va, vb = _flat(a.read(sa.key)), _flat(b.read(sb.key))
    count, changed, nonfinite, diff_sq, a_sq, max_abs = _core.diff_buffers(va, vb, sa.dtype)
    if nonfinite:
        rel, max_abs = math.inf, math.inf
    elif diff_sq == 0.0:
        rel = 0.0
    else:
        rel = math.sqrt(diff_sq) / math.sqrt(a_sq) if a_sq > 0 else math.inf
    return TensorChange(
        sa.key, sa.dtype, sa.shape, changed == 0, "values", rel, max_abs, changed, count,
        math.sqrt(a_sq), math.sqrt(diff_sq),
    )  # fmt: skip


def value_diff(
    path_a: str, path_b: str, *, keys: str | None = None, progress: bool | None = None
) -> ValueDiff:
    """Compare the values of two checkpoints of any readable format (keys matching the glob
    ``keys``), one tensor at a time, so memory stays at two tensors."""
    with open_source(path_a) as a, open_source(path_b) as b:
        specs_a = {s.key: s for s in a.specs()}
        specs_b = {s.key: s for s in b.specs()}
        picked_a = set(select_keys(list(specs_a), keys))
        picked_b = set(select_keys(list(specs_b), keys))
        res = ValueDiff(
            only_a=sorted(k for k in picked_a if k not in specs_b),
            only_b=sorted(k for k in picked_b if k not in specs_a),
        )
        common = sorted(k for k in picked_a if k in specs_b)
        bar = progress_bar(sum(specs_a[k].nbytes for k in common), "diff", progress=progress)
        try:
            for k in common:
                sa, sb = specs_a[k], specs_b[k]
                for what, u, v in (
                    ("kind", sa.kind, sb.kind),
                    ("dtype", sa.dtype, sb.dtype),
                    ("shape", sa.shape, sb.shape),
                ):
                    if u != v:
                        res.mismatched.append((k, what, str(u), str(v)))
                        break
                else:
                    if sa.kind == "tensor":
                        res.tensors.append(_compare(a, b, sa, sb))
                    elif a.read(k) != b.read(k):
                        res.other_changed.append(k)
                bar.update(sa.nbytes)
        finally:
            bar.close()
    res.tensors.sort(key=lambda t: (-t.rel_l2, -t.max_abs, t.key))
    return res
