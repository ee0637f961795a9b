"""The per-tensor choice of a delta: ``same``, ``xor`` or whole (FORMAT.md §11, writer rules),
decided from the XOR's statistics instead of trial compressions.

One pass over every tensor pair, in the Rust core (``_core.xor_stats``: chunk-parallel on the
core's pool, GIL released, each chunk read once): the XOR of the bit patterns, the count of
nonzero elements (zero: ``same``), per byte plane a bound on its nonzero bytes, the new
value's nonzero elements and the crc32c of both values. Byte-grouped zstd (the XOR codec) stores a
plane of ``n`` bytes with ``k`` nonzero ones in about ``k * c(k/n)`` bytes, ``c`` measured on
planes of random nonzero bytes at random positions (the costly case: clustered changes and
small XOR values, what real updates give, store smaller), capped at ``n`` (chunks that do not
compress are stored raw). That estimate is compared with the whole value's stored size:

- a **hint**, when the caller has one: the base's own value stored with a compressing codec
  (its ``stored_bytes``: the real encoder's output on a value a small drift away), or the raw
  size when whole values are stored uncompressed. The XOR is chosen when its estimate is at
  most 0.9x the hint, the whole value when it is at least 1.5x; in between (a dense change:
  the two are close) both are measured on a few windows with the real encoders, as before.
- no hint (weight sync): the XOR when its estimate is at most 1/4 of the raw bytes (a sparse
  change) and at least half the value's elements are nonzero (such a value, float weights
  above all, stores at least about half its bytes whole: the low mantissa bytes are noise;
  a value with many zeros may store far smaller, so it is measured); whole when the
  estimate reaches the raw bytes; windows measured otherwise. A whole value that is nearly
  all nonzero yet compresses below its XOR's estimate (an integer ramp, say) can thus cost
  up to that estimate (at most 1/4 of its raw bytes) more than stored whole.

Without a hint, a close-band value that looks like the sparse case (at least half its elements
nonzero, estimate at most half its raw bytes: the estimate's table models random nonzero bytes,
while a step's XOR of low mantissa bytes is mostly small values that Huffman codes far
cheaper) is first tried on a few small windows of its XOR alone: at most 1/4 of their raw
bytes there makes it ``xor`` with no trial of the whole value (the MiniLM RL step: 20 values,
a quarter of the bytes, whose full trials cost about a fifth of the encode). The rest are
measured both ways as above.

Close-band tensors under 16 KiB (biases, norms) are stored whole without a measurement: the
most it can cost is their raw bytes. So a sparse change, the case deltas are for, costs one XOR, one count and one compression;
only tensors near the break-even point pay for trial compressions.
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .. import _core
from ..storage.save import _opts
from ..storage.values import encode as encode_value

__all__ = [
    "Choice", "Stats", "choose", "stats", "estimate_xor_bytes", "pool_map", "XOR_CODEC",
    "XOR_LEVEL",
]  # fmt: skip

#: the codec of XOR payloads: byte-grouped zstd (runs of zero bytes cost next to nothing)
XOR_CODEC = "zstd-bytegroup"
XOR_LEVEL = 1

# Stored bytes per nonzero byte of a plane against log10 of the plane's nonzero fraction:
# zstd-bytegroup level 1 on 1 Mi-element planes of random nonzero bytes at random positions
# (measured for this module; rounded up). Sparse planes pay a match and a literal per
# nonzero byte (~4-5 bytes), dense ones approach a byte per byte.
_LOG_FRACTION = (-7.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, -0.2, 0.0)
_BYTES_PER_NONZERO = (16.0, 12.5, 5.2, 4.7, 4.1, 3.0, 1.95, 1.45, 1.1)
#: per chunk and plane: frame and table headers (also what an all-zero plane costs)
_CHUNK_OVERHEAD = 64
_CHUNK = 1 << 20
#: the hint bands (see the module docstring)
_XOR_BELOW, _FULL_ABOVE = 0.9, 1.5
_SPARSE_OF_RAW = 1 / 4
#: tensors in the close band below this many bytes are stored whole, unmeasured
_SMALL = 16 << 10
#: trial windows for tensors in the close band: a few windows of this size (whole when small)
_SAMPLE = 64 << 10  # 128 KiB gave the same choices on MiniLM at ~6% more encode time
_WINDOWS = 4
#: the quick XOR-only trial of sparse-looking close-band values (no hint): windows of this size
_QUICK = 8 << 10
#: ... for values whose estimate is at most this fraction of their raw bytes
_QUICK_UP_TO = 0.5
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Choice:
    """How one key is stored: ``mode`` (``"same"``, ``"xor"`` or ``"full"``) and the crc32c
    of the new and the base value."""

    mode: str
    crc: int
    base_crc: int


def pool_map(fn: Callable[[T], R], items: list[T], threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` on ``threads`` threads (default: one per CPU), in order."""
    n = min(len(items), threads or os.cpu_count() or 1)
    if n <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(n, thread_name_prefix="shardpoint-delta") as ex:
        return list(ex.map(fn, items))


def _width(nbytes: int, itemsize: int) -> int:
    """The word width statistics are counted in: the itemsize when it is 1, 2, 4 or 8 and
    divides the length, else 8 (complex128: its float64 halves) or single bytes."""
    if itemsize in _UINT and nbytes % itemsize == 0:
        return itemsize
    return 8 if nbytes % 8 == 0 else 1


@dataclass
class Stats:
    """What the statistics pass gives per pair (see :func:`stats`)."""

    changed: int
    planes: list[int]
    nonzero_fraction: float
    crc: int
    base_crc: int


def stats(pairs: Mapping[str, tuple[np.dtype, np.ndarray, np.ndarray]]) -> dict[str, Stats]:
    """:class:`Stats` of each pair (``key -> (dtype, new bytes, base bytes)``, 1-d uint8):
    changed elements, per byte plane (least significant first) the elements whose XOR reaches
    it, the new value's fraction of nonzero elements and both crc32c; one core call."""
    keys = list(pairs)
    widths = [_width(pairs[k][1].size, pairs[k][0].itemsize) for k in keys]
    got = _core.xor_stats([pairs[k][1] for k in keys], [pairs[k][2] for k in keys], widths)
    out = {}
    for k, w, (changed, planes, nonzero, crc, base_crc) in zip(keys, widths, got, strict=True):
        n = pairs[k][1].size // w
        out[k] = Stats(changed, planes, nonzero / max(1, n), crc, base_crc)
    return out


def _estimate(planes: list[int], nbytes: int) -> int:
    """Estimated stored bytes of an XOR payload of ``nbytes`` whose planes have (at most)
    ``planes`` nonzero bytes (module docstring). Plain Python: it runs once per key on a
    handful of numbers, where numpy's per-call overhead was ~2 ms of a 100-key encode."""
    if not planes or planes[0] == 0:
        return 0
    n = nbytes / len(planes)
    cost = 0.0
    for p in planes:
        if p <= 0:
            continue
        x = math.log10(max(p / n, 1e-7))
        i = min(max(bisect.bisect_right(_LOG_FRACTION, x), 1), len(_LOG_FRACTION) - 1)
        x0, x1 = _LOG_FRACTION[i - 1], _LOG_FRACTION[i]
        y0, y1 = _BYTES_PER_NONZERO[i - 1], _BYTES_PER_NONZERO[i]
        per = y0 + (y1 - y0) * (min(max(x, x0), x1) - x0) / (x1 - x0)
        cost += min(p * per, n)
    chunks = -(-nbytes // _CHUNK)
    return int(cost) + _CHUNK_OVERHEAD * chunks * len(planes)


def estimate_xor_bytes(x: np.ndarray, itemsize: int) -> tuple[int, int]:
    """(nonzero elements, estimated stored bytes) of XOR payload ``x`` (1-d uint8) under
    byte-grouped zstd level 1 (see the module docstring)."""
    dtype = (
        np.dtype([("b", np.uint8, (itemsize,))])
        if itemsize not in _UINT
        else np.dtype(_UINT[itemsize])
    )
    (s,) = stats({"x": (dtype, x, np.zeros_like(x))}).values()
    return s.changed, _estimate(s.planes, x.size)


def _band(est: int, raw: int, nonzero_fraction: float, hint: int | None) -> str:
    """``"xor"``, ``"full"`` or ``"close"`` (measure) for an XOR estimate of a value of
    ``raw`` bytes with that fraction of nonzero elements (module docstring)."""
    if hint is not None:
        if est <= _XOR_BELOW * hint:
            return "xor"
        return "full" if est >= _FULL_ABOVE * hint else "close"
    if est >= raw:
        return "full"
    # a value with few zero elements stores at least about half its bytes whole (float
    # mantissas are noise); zero-rich values can store far smaller, so they are measured
    if est <= _SPARSE_OF_RAW * raw and nonzero_fraction >= 0.5:
        return "xor"
    return "close"


def choose(
    pairs: Mapping[str, tuple[np.dtype, np.ndarray, np.ndarray]],
    compression: Any,
    level: Any,
    *,
    hints: Mapping[str, int] | None = None,
) -> dict[str, Choice]:
    """The :class:`Choice` of each key of ``pairs`` (``key -> (dtype, new bytes, base
    bytes)``, 1-d uint8) for whole values stored with ``compression``/``level``. ``hints``:
    the whole value's expected stored bytes per key, where known (module docstring). Nothing
    is kept of the XOR: the writer computes it again chunk by chunk as it encodes."""
    hints = hints or {}
    out, estimates, nonzero = {}, {}, {}
    for key, s in stats(pairs).items():
        nb = pairs[key][1]
        est = estimates[key] = _estimate(s.planes, nb.size)
        nonzero[key] = s.nonzero_fraction
        mode = "same" if s.changed == 0 else _band(est, nb.size, s.nonzero_fraction, hints.get(key))
        out[key] = Choice(mode, s.crc, s.base_crc)
    close = [k for k, c in out.items() if c.mode == "close"]
    small = [k for k in close if pairs[k][1].size < _SMALL]
    close = [k for k in close if pairs[k][1].size >= _SMALL]
    for k in small:  # not worth a measurement: whole costs at most its raw bytes
        out[k].mode = "full"
    quick = {
        k: pairs[k]
        for k in close
        if k not in hints and estimates[k] <= _QUICK_UP_TO * pairs[k][1].size and nonzero[k] >= 0.5
    }
    if quick:
        for k in _quick_xor(quick):
            out[k].mode = "xor"
        close = [k for k in close if out[k].mode == "close"]
    if close:
        measured = _measure({k: pairs[k] for k in close}, compression, level)
        for k in close:
            out[k].mode = measured[k]
    return out


def _windows(b: np.ndarray, itemsize: int, size: int = _SAMPLE) -> list[np.ndarray]:
    """A few evenly spaced windows of ``size`` bytes of a byte array (the whole array when
    small)."""
    if b.size <= _WINDOWS * size * 2:
        return [b]
    step = (b.size - size) // (_WINDOWS - 1)
    step -= step % itemsize
    return [b[i * step : i * step + size] for i in range(_WINDOWS)]


def _quick_xor(pairs: Mapping[str, tuple[np.dtype, np.ndarray, np.ndarray]]) -> list[str]:
    """The keys whose XOR, encoded on a few small windows, takes at most 1/4 of the windows'
    raw bytes (module docstring: such a value is a sparse change)."""
    xors: dict[str, tuple[Any, list[np.ndarray], list[np.ndarray] | None]] = {}
    raw = {}
    for key, (dtype, nb, ob) in pairs.items():
        wn, wo = _windows(nb, dtype.itemsize, _QUICK), _windows(ob, dtype.itemsize, _QUICK)
        xors[key] = (dtype, wn, wo)
        raw[key] = sum(w.size for w in wn)
    sizes = _stored_sizes(xors, XOR_CODEC, XOR_LEVEL)
    return [k for k in pairs if sizes[k] <= _SPARSE_OF_RAW * raw[k]]


def _typed(b: np.ndarray, dtype: Any) -> np.ndarray:
    return b.view(dtype) if b.size % dtype.itemsize == 0 else b


def _stored_sizes(
    samples: dict[str, tuple[Any, list[np.ndarray], list[np.ndarray] | None]],
    compression: Any,
    level: Any,
) -> dict[str, int]:
    """Stored bytes of each sample set (``key -> (dtype, windows, XOR base windows or
    None)``) under one codec: the real encoder's output (no model of it to drift from it),
    encoded in memory in one core call (chunk-parallel, GIL released) and not kept."""
    codec, lvl = _opts(compression, level)
    items, bases, owner = [], [], []
    for key, (dtype, wins, base_wins) in samples.items():
        for i, w in enumerate(wins):
            items.append(encode_value(f"{i}/{key}", _typed(w, dtype)))
            bases.append(None if base_wins is None else base_wins[i])
            owner.append(key)
    sizes = _core.encoded_sizes(
        items, codec=codec, level=lvl, chunk_bytes=int(_core.DEFAULT_CHUNK_BYTES), xor_bases=bases
    )
    out = dict.fromkeys(samples, 0)
    for key, n in zip(owner, sizes, strict=True):
        out[key] += n
    return out


def _measure(
    pairs: Mapping[str, tuple[np.dtype, np.ndarray, np.ndarray]], compression: Any, level: Any
) -> dict[str, str]:
    """``"xor"`` or ``"full"`` per key, from both encodings of a few windows through the real
    encoders (the close band: a dense change still stores at most what a full save does,
    within the windows' sampling error)."""
    fulls: dict[str, tuple[Any, list[np.ndarray], list[np.ndarray] | None]] = {}
    xors: dict[str, tuple[Any, list[np.ndarray], list[np.ndarray] | None]] = {}
    for key, (dtype, nb, ob) in pairs.items():
        wn, wo = _windows(nb, dtype.itemsize), _windows(ob, dtype.itemsize)
        fulls[key] = (dtype, wn, None)
        xors[key] = (dtype, wn, wo)  # the XOR is taken chunk by chunk by the encoder
    full_sz = _stored_sizes(fulls, compression, level)
    xor_sz = _stored_sizes(xors, XOR_CODEC, XOR_LEVEL)
    return {k: "xor" if xor_sz[k] < full_sz[k] else "full" for k in pairs}
