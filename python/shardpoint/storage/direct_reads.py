"""The cold-read engine's Python face (docs/SERVING.md "Cold reads"): ranges of plain files
read with ``O_DIRECT`` where their pages are not cached."""

from __future__ import annotations

import numpy as np

from .. import _core

__all__ = ["read_ranges_direct"]


def read_ranges_direct(
    paths: list[str],
    ranges: list[tuple[int, int]],
    outs: list[np.ndarray],
    depth: int | None = None,
) -> tuple[int, int, int]:
    """``read_ranges_into`` for files that may not be in the page cache: pieces not cached are
    read with ``O_DIRECT``, ``depth`` reads in flight (default 8), straight into an output whose
    address is congruent to its file offset modulo 4096 and through a bounce buffer otherwise;
    cached pieces with ``pread``. Returns the bytes read in place, bounced and from the page
    cache."""
    in_place, bounced, cached = _core.read_file_ranges_direct(paths, ranges, outs, depth)
    return int(in_place), int(bounced), int(cached)
