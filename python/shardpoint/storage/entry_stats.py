"""What a reader reports about entries: the index record of one key (:class:`EntryInfo`) and
one tensor's statistics as a dict (:func:`stats_dict`), shared by shardpoint's own reader and
the readers of other formats read in place (Hugging Face safetensors)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["EntryInfo", "STATS_FIELDS", "stats_dict"]


@dataclass(frozen=True, slots=True, weakref_slot=True)
class EntryInfo:
    """What the index records about one key.

    Slotted: a reader's plan holds one per key (20,000 for some models), and without a
    ``__dict__`` each is one object for Python's collector, not two (a weak reference to one
    still works, as before)."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    codec: str
    stored_bytes: int
    raw_bytes: int
    shard: int
    offset: int
    crc32c: int
    chunks: int
    #: crc blocks of an uncompressed value (FORMAT.md §3.4): a checked row slice reads only
    #: the blocks holding its rows; 0: one crc covers the whole value
    crc_blocks: int = 0

    @property
    def ratio(self) -> float:
        """raw / stored size (1.0 for uncompressed or empty entries)."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 1.0


#: Field names of the statistics tuple the core returns (``_core.stats_buffer``).
STATS_FIELDS = (
    "count", "finite", "nan", "posinf", "neginf", "zeros", "min", "max", "mean", "std", "l2",
)  # fmt: skip


def stats_dict(dtype: str, shape: tuple[int, ...], t: tuple[Any, ...]) -> dict[str, Any]:
    """One tensor's statistics as a JSON-able dict (NaN moments of an all-non-finite tensor
    become ``None``)."""
    d: dict[str, Any] = {"dtype": dtype, "shape": list(shape)}
    for name, v in zip(STATS_FIELDS, t, strict=True):
        d[name] = None if isinstance(v, float) and math.isnan(v) else v
    return d


def _batches(infos: list[EntryInfo], limit: int) -> Iterator[list[EntryInfo]]:
    """Consecutive groups of about ``limit`` raw bytes (one core call each)."""
    cur: list[EntryInfo] = []
    acc = 0
    for i in infos:
        cur.append(i)
        acc += i.raw_bytes
        if acc >= limit:
            yield cur
            cur, acc = [], 0
    if cur:
        yield cur
