"""Per-tensor statistics of any readable checkpoint (``shardpoint stats``)."""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from .. import _core, storage
from ..convert import detect_format, open_source
from ..storage import stats_dict
from ..storage.progress import progress_bar

__all__ = ["checkpoint_stats", "has_nonfinite", "select_keys"]


def select_keys(keys: list[str], pattern: str | None) -> list[str]:
    """``keys`` matching the shell-style glob ``pattern`` (all when ``None``); ``*`` also
    crosses ``/``, so ``model/*/weight`` matches every layer's weight."""
    if pattern is None:
        return keys
    return [k for k in keys if fnmatch.fnmatchcase(k, pattern)]


def checkpoint_stats(
    path: str, *, keys: str | None = None, progress: bool | None = None
) -> dict[str, dict[str, Any]]:
    """``{key: stats}`` (see ``Reader.stats``) of the tensors of ``path`` matching the glob
    ``keys``. shardpoint checkpoints and Hugging Face safetensors (directory, index or file) are
    read in place by the Rust core; other formats (.pt, TensorFlow) value by value, each value
    handed to the core as a buffer."""
    fmt, resolved = detect_format(path)
    if fmt in ("shardpoint", "hf", "safetensors"):
        with storage.open(resolved) as r:
            tensors = [k for k in r.keys() if r.info(k).kind == "tensor"]
            return r.stats(select_keys(tensors, keys), progress=progress)
    with open_source(resolved) as src:
        specs = [s for s in src.specs() if s.kind == "tensor"]
        wanted = set(select_keys([s.key for s in specs], keys))
        specs = [s for s in specs if s.key in wanted]
        out: dict[str, dict[str, Any]] = {}
        bar = progress_bar(sum(s.nbytes for s in specs), "stats", progress=progress)
        try:
            for s in specs:
                flat = np.ascontiguousarray(src.read(s.key)).reshape(-1).view(np.uint8)
                out[s.key] = stats_dict(s.dtype, s.shape, _core.stats_buffer(flat, s.dtype))
                bar.update(s.nbytes)
        finally:
            bar.close()
        return out


def has_nonfinite(stats: dict[str, dict[str, Any]]) -> list[str]:
    """Keys whose tensor holds a NaN or an infinity."""
    return [k for k, s in stats.items() if s["nan"] or s["posinf"] or s["neginf"]]
