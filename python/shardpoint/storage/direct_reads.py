"""The cold-read engine's Python face (docs/SERVING.md "Cold reads"): ranges of plain files
read with ``O_DIRECT`` where their pages are not cached, and a local checkpoint's values read
that way (uncompressed ones checked against their crc32c after they land)."""

from __future__ import annotations

import numpy as np

from .. import _core
from .entry_stats import EntryInfo

__all__ = ["read_ranges_direct", "read_entries_direct"]

#: Direct reads in flight for compressed values (the engine's default, as for plain ranges).
_DEPTH = 8


def local_shards_core(core: object) -> _core.CheckpointReader | None:
    """``core`` when it is a local checkpoint of shard files (the cold-read engine reads
    those), else None. Here so that the adapters need not import the compiled module (which
    the import contracts see as the package root)."""
    if isinstance(core, _core.CheckpointReader) and not core.is_single_file():
        return core
    return None


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


def read_entries_direct(
    core: _core.CheckpointReader,
    infos: list[EntryInfo],
    outs: list[np.ndarray],
    verify: bool,
    threads: int | None = None,
) -> tuple[int, int, int]:
    """The values ``infos`` of a local checkpoint (``core``) into ``outs`` (each the value's raw
    bytes), every stored byte through the cold-read engine, read from the shard files ``core``
    opened (a save at the same prefix since then does not change what is read): uncompressed
    values straight into ``outs`` and then, with ``verify``, checked against their crc32c over
    the bytes landed (a damaged byte raises ``ChecksumMismatchError`` naming the shard and
    key); compressed ones in blocks of whole chunks read with ``O_DIRECT`` and decoded from the
    engine's buffers (always checked end to end). A direct read skips the page cache's fill and
    the kernel's copy: about half the CPU of a cold buffered load of uncompressed values, a
    quarter for the default codec's (docs/SERVING.md, "Issue 41 (seventh round)" and "(ninth
    round)"). Returns the bytes read by ``O_DIRECT`` in place, bounced and from the page cache
    (stored bytes for compressed values)."""
    todo = [(i, o) for i, o in zip(infos, outs, strict=True) if o.nbytes]
    if not todo:
        return 0, 0, 0
    got = core.read_many_into(
        [i.key for i, _ in todo], [o for _, o in todo], verify, threads, _DEPTH
    )
    in_place, bounced, cached = got or (0, 0, 0)
    return int(in_place), int(bounced), int(cached)
