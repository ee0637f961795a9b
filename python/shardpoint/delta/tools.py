"""Tools over delta checkpoints: the per-tensor choice (:func:`describe`, for
``shardpoint info``), the bases a checkpoint needs (:func:`needed_bases`, for retention and
``gc``) and export back to a checkpoint without a base (:func:`to_full`)."""

from __future__ import annotations

import os
from typing import Any

from ..storage import Writer
from ..storage import open as open_checkpoint
from ..storage.paths import _prefix
from .reader import DeltaReader

__all__ = ["describe", "needed_bases", "to_full"]


def describe(prefix: Any) -> dict[str, Any]:
    """The delta table of checkpoint ``prefix`` in readable form: ``{"base", "depth",
    "tensors": {key: {"mode", "stored_bytes", "raw_bytes"}}}`` (``{}`` for a checkpoint that is
    not a delta)."""
    with open_checkpoint(prefix) as r:
        if not isinstance(r, DeltaReader):
            return {}
        table = r.delta_table
        tensors = {}
        for key in r.keys():
            info = r.info(key)
            e = table.entries.get(key)
            tensors[key] = {
                "mode": "full" if e is None else e.mode,
                "stored_bytes": 0 if e is not None and e.mode == "same" else info.stored_bytes,
                "raw_bytes": info.raw_bytes,
            }
        base = r.base_path if table.base_path is not None else None
        return {"base": base, "base_digest": table.base_digest, "depth": table.depth,
                "tensors": tensors}  # fmt: skip


def needed_bases(prefix: Any) -> list[str]:
    """Every checkpoint that ``prefix`` needs to be read: its base, its base's base, … (normalized
    absolute prefixes; ``[]`` for a full checkpoint). Retention keeps these."""
    out: list[str] = []
    p = os.path.abspath(_prefix(prefix))
    while True:
        with open_checkpoint(p) as r:
            if not isinstance(r, DeltaReader) or r.delta_table.base_path is None:
                return out
            p = r.base_path
        if p in out or len(out) > 1000:
            return out
        out.append(p)


def to_full(
    src: Any, dst: Any, *, compression: str | None = "zstd", level: int | None = None
) -> None:
    """Write the values of (delta) checkpoint ``src`` to ``dst`` as a checkpoint that needs no
    base (one value at a time: memory stays about the largest value); user metadata is kept."""
    with open_checkpoint(src) as r:
        with Writer(dst, compression=compression, level=level, metadata=r.metadata) as w:
            for key in r.keys():
                w.add(key, r[key])
