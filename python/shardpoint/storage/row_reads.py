"""Rows of stored tensors (first-axis ranges), many at once: what ``Reader.slice`` and
``Reader.slice_many`` read.

Only the bytes holding the rows are read, and with ``verify`` they are checked: compressed
values by the crcs of the chunks holding the rows; uncompressed values with crc blocks
(FORMAT.md §3.4) by the crcs of the blocks holding them; uncompressed values without (older
files, values of one block) by their whole-value crc (locally once per reader, from an object
store on every download: a checked download is never trusted for the next). On an object
store all the ranges of one call are fetched together, neighbours of a shard in one GET.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgumentError
from .dtypes import carrier_dtype, numpy_dtype
from .entry_stats import EntryInfo

__all__ = ["read_rows"]


class _RowReader(Protocol):
    """What :func:`read_rows` needs of a reader (``storage.reader.Reader``)."""

    _verify: bool

    @property
    def _core(self) -> Any: ...

    @property
    def _remote(self) -> bool: ...

    @property
    def _carriers(self) -> bool: ...

    def info(self, key: str) -> EntryInfo: ...

    def _check_once(self, key: str) -> None: ...


def read_rows(reader: _RowReader, items: Sequence[tuple[str, int, int]]) -> list[np.ndarray]:
    """Rows ``start:stop`` of each ``(key, start, stop)`` (Python slice rules, step 1), as new
    C-contiguous arrays, in order."""
    verify = reader._verify
    # (key, lo, hi, out, checked by the core): a local uncompressed value without crc blocks
    # is checked whole once per reader, then its ranges are read unchecked
    plan: list[tuple[str, int, int, np.ndarray, bool]] = []
    for key, start, stop in items:
        info = reader.info(key)
        if info.kind != "tensor" or not info.shape:
            raise InvalidArgumentError(f"key {key!r}: only tensors with ndim >= 1 can be sliced")
        start, stop, _ = slice(start, stop).indices(info.shape[0])
        stop = max(start, stop)
        dt = (carrier_dtype if reader._carriers else numpy_dtype)(info.dtype)
        row = dt.itemsize * math.prod(info.shape[1:])
        out = np.empty((stop - start, *info.shape[1:]), dtype=dt)
        whole_crc = info.codec == "none" and not info.crc_blocks
        if verify and whole_crc and not reader._remote:
            reader._check_once(key)
            plan.append((key, start * row, stop * row, out, False))
        else:
            plan.append((key, start * row, stop * row, out, verify))
    for checked in (True, False):
        part = [p for p in plan if p[4] == checked]
        if part:
            reader._core.read_ranges_into(
                [p[0] for p in part],
                [p[1] for p in part],
                [p[2] for p in part],
                [p[3].reshape(-1).view(np.uint8) for p in part],
                checked,
            )
    return [p[3] for p in plan]
