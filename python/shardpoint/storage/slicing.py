"""Lazy tensor slices: ``Reader.get_slice(key)[...]``, as safetensors' ``safe_open().get_slice``.

A :class:`TensorSlice` holds only the entry's index record. Indexing it reads the selected
elements and nothing else worth mentioning:

* uncompressed entries with crc blocks (FORMAT.md §3.4), read with ``verify``, are read as
  compressed ones are (below), by runs, each checking the 16 KiB blocks it reads;
* other uncompressed entries are indexed through a copy-on-write view of the shard's mapping;
  the first slice of a value checks its crc32c, which covers the whole value (read once),
  later slices read only the pages holding selected elements (``sp.open(..., verify=False)``
  skips the check and keeps even the first slice page-lazy); from an object store every such
  slice downloads the whole value once, checks it and cuts the selection from that download
  (a network may damage any one download, so no check carries over to the next);
* compressed entries are read with ``read_range`` over *runs* of the selection: the selected
  rows (along the first axis with more than one selected index) are grouped into byte runs, a
  new run starting wherever the gap to the previous row's last selected byte is at least one
  chunk, or the run would pass :data:`RUN_BYTES`. Only the chunks overlapping a run are
  decoded (crc-checked, in parallel), so a tensor-parallel loader reading its rows or columns
  decodes its share of the chunks (all of them only when every chunk holds selected elements).

Index rules (safetensors' where they exist, numpy's otherwise, see docs/TORCH.md):
ints (negative ones count from the end), slices with any non-zero step (negative steps too,
which safetensors refuses), one ``Ellipsis``; an index or slice bound outside the dimension
raises :class:`~shardpoint.errors.InvalidSliceError` (an ``IndexError``), where numpy would
clip; ``[]`` as the whole index selects nothing; non-empty lists, arrays, ``None``
and bools are refused, as safetensors refuses lists and ``None``.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgumentError, InvalidSliceError
from .dtypes import numpy_dtype, safetensors_name

__all__ = ["TensorSlice", "LazySlice", "RUN_BYTES"]

#: Largest temporary buffer one run of a compressed read uses (a single longer row is one run).
RUN_BYTES = 64 << 20
#: The crc block of uncompressed values the writer makes (FORMAT.md §3.4).
CRC_BLOCK = 16 << 10


def _describe(index: tuple[Any, ...]) -> str:
    """``[0:10, ::2, ...]``: the index as the user wrote it (for error messages)."""

    def one(x: Any) -> str:
        if isinstance(x, slice):
            text = ("" if x.start is None else str(x.start)) + ":"
            text += "" if x.stop is None else str(x.stop)
            return text + ("" if x.step is None else f":{x.step}")
        return "..." if x is Ellipsis else repr(x)

    return "[" + ", ".join(one(x) for x in index) + "]"


class LazySlice(Protocol):
    """What ``Reader.get_slice`` returns, whatever the reader (safetensors' slice interface)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def get_shape(self) -> list[int]: ...

    def get_dtype(self) -> str: ...

    def __getitem__(self, index: Any) -> Any: ...


class _EntryInfo(Protocol):
    """What a slice reads of its entry's index record (``reader.EntryInfo`` has it)."""

    @property
    def kind(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...

    @property
    def codec(self) -> str: ...


class SliceSource(Protocol):
    """What a slice needs of its reader (``Reader`` and the in-place readers of foreign formats
    have it). A protocol, so that this module sits below the readers that hand slices out."""

    def info(self, key: str) -> _EntryInfo: ...

    def _view_checked_once(self, key: str) -> Any: ...

    @property
    def _core(self) -> Any: ...


class _Axis:
    """One normalized axis: ``count`` indices ``start, start + step, ...``; ``drop`` for an
    int index (the axis disappears from the result)."""

    __slots__ = ("start", "step", "count", "drop")

    def __init__(self, start: int, step: int, count: int, drop: bool) -> None:
        self.start, self.step, self.count, self.drop = start, step, count, drop


class TensorSlice:
    """A lazily read tensor entry: ``shape``, ``dtype``, ``get_shape()``, ``get_dtype()``, and
    numpy-style ``[...]`` that reads only what it selects. Get one from ``Reader.get_slice``."""

    def __init__(self, reader: SliceSource, key: str) -> None:
        info = reader.info(key)
        if info.kind != "tensor":
            raise InvalidArgumentError(f"key {key!r} holds a {info.kind} value, not a tensor")
        self._reader = reader
        self.key = key
        self._info = info
        #: the entry's shape
        self.shape: tuple[int, ...] = info.shape
        #: the numpy (or ml_dtypes) dtype of the entry
        self.dtype: np.dtype = numpy_dtype(info.dtype)

    def get_shape(self) -> list[int]:
        """The shape as a list (safetensors' ``get_shape``)."""
        return list(self.shape)

    def get_dtype(self) -> str:
        """The dtype as safetensors spells it (``"F32"``, ``"BF16"``, ``"F8_E4M3"``...)."""
        return safetensors_name(self._info.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor slice")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"TensorSlice(key={self.key!r}, shape={self.shape}, dtype={self._info.dtype})"

    # ---------------------------------------------------------------------------------------
    # index normalization
    # ---------------------------------------------------------------------------------------

    def _error(self, index: tuple[Any, ...], what: str) -> InvalidSliceError:
        return InvalidSliceError(
            f"key {self.key!r}: error during slicing {_describe(index)} with shape "
            f"{list(self.shape)}: {what}"
        )

    def _axes(self, index: tuple[Any, ...]) -> list[_Axis] | None:
        """Normalized axes, or None for the empty-list index (selects nothing on axis 0)."""
        if len(index) == 1 and isinstance(index[0], list) and not index[0]:
            if not self.shape:
                raise self._error(index, "more slicing indexes than dimensions in tensor")
            return None
        ellipses = sum(1 for x in index if x is Ellipsis)
        if ellipses > 1:
            raise self._error(index, "only one ellipsis (...) is allowed in slice index")
        given = len(index) - ellipses
        if given > len(self.shape):
            raise self._error(index, "more slicing indexes than dimensions in tensor")
        full: list[Any] = []
        for x in index:
            if x is Ellipsis:
                full.extend([slice(None)] * (len(self.shape) - given))
            else:
                full.append(x)
        full.extend([slice(None)] * (len(self.shape) - len(full)))
        return [
            self._axis(index, pos, x, n)
            for pos, (x, n) in enumerate(zip(full, self.shape, strict=True))
        ]

    def _axis(self, index: tuple[Any, ...], pos: int, x: Any, n: int) -> _Axis:
        if isinstance(x, slice):
            return self._slice_axis(index, pos, x, n)
        if isinstance(x, list):
            if x:
                raise self._error(index, "non-empty lists are not implemented (as in safetensors)")
            raise self._error(
                index,
                f"unsupported slice index at position {pos}: an empty list is only "
                "accepted as the whole index",
            )
        if isinstance(x, bool | np.bool_) or x is None or isinstance(x, np.ndarray):
            raise self._error(
                index,
                f"unsupported slice index at position {pos}: expected slice, int, or ellipsis",
            )
        try:
            i = operator.index(x)
        except TypeError:
            raise self._error(
                index,
                f"unsupported slice index at position {pos}: expected slice, int, or ellipsis",
            ) from None
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise self._error(
                index, f"index {i} out of bounds for tensor dimension #{pos} of size {n}"
            )
        return _Axis(j, 1, 1, True)

    def _slice_axis(self, index: tuple[Any, ...], pos: int, x: slice, n: int) -> _Axis:
        def bound(v: Any, name: str) -> int | None:
            if v is None:
                return None
            try:
                b = operator.index(v)
            except TypeError:
                raise self._error(
                    index, f"slice {name} at position {pos} must be an int, got {v!r}"
                ) from None
            r = b + n if b < 0 else b
            if not 0 <= r <= n:
                raise self._error(
                    index, f"index {b} out of bounds for tensor dimension #{pos} of size {n}"
                )
            return r

        step = 1 if x.step is None else self._step(index, x.step)
        start, stop = bound(x.start, "start"), bound(x.stop, "stop")
        if step > 0:
            lo = 0 if start is None else start
            hi = n if stop is None else stop
            count = max(0, -(-(hi - lo) // step))
            return _Axis(lo, step, count, False)
        hi = n - 1 if start is None else min(start, n - 1)
        if stop is None:
            count = -(-(hi + 1) // -step) if hi >= 0 else 0
        else:
            count = max(0, -(-(hi - stop) // -step))
        return _Axis(hi, step, count, False)

    def _step(self, index: tuple[Any, ...], step: Any) -> int:
        """A non-zero int slice step."""
        try:
            s = operator.index(step)
        except TypeError:
            raise self._error(index, f"slice step must be an int, got {step!r}") from None
        if s == 0:
            raise self._error(index, "slice step cannot be zero")
        return s

    # ---------------------------------------------------------------------------------------
    # reading
    # ---------------------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        """The selected elements, as the reader's framework hands tensors out (numpy by
        default)."""
        out = self._select(index)
        convert = getattr(self._reader, "_tensor_out", None)
        return out if convert is None else convert(out)

    def _select(self, index: Any) -> np.ndarray:
        idx = index if isinstance(index, tuple) else (index,)
        axes = self._axes(idx)
        if axes is None:
            return np.empty((0,) + self.shape[1:], dtype=self.dtype)
        out_shape = tuple(a.count for a in axes if not a.drop)
        if any(a.count == 0 for a in axes):
            return np.empty(out_shape, dtype=self.dtype)
        if self._info.codec == "none" and not self._checked_blocks():
            return self._from_mapping(axes).reshape(out_shape)
        # read with positive steps, then flip the axes that were asked for backwards
        flips = []
        for d, a in enumerate(axes):
            if a.step < 0:
                a.start, a.step = a.start + (a.count - 1) * a.step, -a.step
                flips.append(d)
        got = self._read_runs(axes)
        if flips:
            got = np.flip(got, axis=tuple(flips)).copy()
        return got.reshape(out_shape)

    def _checked_blocks(self) -> bool:
        """Whether this uncompressed value is read by runs, each checked by the crc blocks
        it reads (FORMAT.md §3.4), rather than checked whole: it has blocks and its reader
        checks (``verify``)."""
        blocks = getattr(self._info, "crc_blocks", 0)
        return bool(blocks) and bool(getattr(self._reader, "_verify", False))

    def _from_mapping(self, axes: list[_Axis]) -> np.ndarray:
        """Uncompressed: index a zero-copy view of the mapped shard; only touched pages load."""
        # crc-checked whole on the first slice of this key, then only the touched pages load
        view = self._reader._view_checked_once(self.key)
        sel = []
        for a in axes:
            stop: int | None = a.start + a.step * a.count  # one step past the last index
            if stop is not None and stop < 0:  # walked backwards past index 0
                stop = None
            sel.append(slice(a.start, stop, a.step))
        return np.array(view[tuple(sel)], copy=True)

    def _read_runs(self, axes: list[_Axis]) -> np.ndarray:
        """Compressed: decode only the chunks overlapping the selection's byte runs."""
        dt = self.dtype
        strides = [dt.itemsize * math.prod(self.shape[d + 1 :]) for d in range(len(self.shape))]
        counts = [a.count for a in axes]
        out = np.empty(counts, dtype=dt)
        # Leading axes with one selected index only shift the base offset; the first axis with
        # several selected indices is the "row" axis that runs are cut along.
        base = 0
        k = 0
        while k < len(axes) - 1 and axes[k].count == 1:
            base += axes[k].start * strides[k]
            k += 1
        if not axes:  # 0-d entry
            self._reader._core.read_range(self.key, 0, dt.itemsize, out.reshape(-1).view(np.uint8))
            return out
        rows = axes[k]
        inner_lo = sum(a.start * strides[d] for d, a in enumerate(axes) if d > k)
        inner_hi = (
            sum(
                (a.start + a.step * (a.count - 1)) * strides[d] for d, a in enumerate(axes) if d > k
            )
            + dt.itemsize
        )
        row_starts = (
            base + (rows.start + rows.step * np.arange(rows.count, dtype=np.int64)) * (strides[k])
        )
        lo = row_starts + inner_lo
        hi = row_starts + inner_hi
        # a new run where the gap is a chunk (compressed) or a crc block (uncompressed)
        unit = CRC_BLOCK if self._info.codec == "none" else self._reader._core.chunk_bytes()
        gap_limit = max(int(unit), 1)
        view_strides = [rows.step * strides[k]] + [
            a.step * strides[d] for d, a in enumerate(axes) if d > k
        ]
        flat_out = out.reshape((rows.count,) + tuple(counts[k + 1 :]))
        # runs: split where the gap to the previous row is a chunk or more (vectorized: a
        # million selected rows cost one numpy pass, not a Python loop), then cap each run's
        # buffer at RUN_BYTES (hi grows with the row, so a binary search finds the cut)
        cuts = np.flatnonzero(lo[1:] - hi[:-1] >= gap_limit) + 1
        bounds = [0, *cuts.tolist(), rows.count]
        for s0, e0 in zip(bounds[:-1], bounds[1:], strict=True):
            a = s0
            while a < e0:
                b = a + int(np.searchsorted(hi[a:e0], lo[a] + RUN_BYTES, side="right")) - 1
                b = max(a, b)
                self._read_run(int(lo[a]), int(hi[b]), flat_out[a : b + 1], view_strides)
                a = b + 1
        return out

    def _read_run(self, lo: int, hi: int, dst: np.ndarray, strides: list[int]) -> None:
        """Bytes ``[lo, hi)`` of the entry, strided into ``dst`` (read in place if contiguous)."""
        if dst.flags.c_contiguous and dst.nbytes == hi - lo:
            self._read_bytes(lo, hi, dst.reshape(-1).view(np.uint8))
            return
        buf = np.empty(hi - lo, dtype=np.uint8)
        self._read_bytes(lo, hi, buf)
        dst[...] = np.ndarray(dst.shape, dtype=self.dtype, buffer=buf, strides=strides)

    def _read_bytes(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Raw bytes ``[lo, hi)`` into ``out``: compressed ones checked by their chunks,
        uncompressed ones (``_checked_blocks``) by their crc blocks."""
        if self._info.codec == "none":
            self._reader._core.read_range(self.key, lo, hi, out, True)
        else:
            self._reader._core.read_range(self.key, lo, hi, out)
