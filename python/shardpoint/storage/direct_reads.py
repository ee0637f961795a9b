"""The cold-read engine's Python face (docs/SERVING.md "Cold reads"): ranges of plain files
read with ``O_DIRECT`` where their pages are not cached, and a local checkpoint's values read
that way (uncompressed ones checked against their crc32c after they land)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import _core
from .entry_stats import EntryInfo

__all__ = [
    "COLD_MIN",
    "judged_cold",
    "read_cold_into",
    "read_entries_direct",
    "read_ranges_direct",
]

#: Direct reads in flight for compressed values (the engine's default, as for plain ranges).
_DEPTH = 8
#: A ``load_into`` read of at least this many bytes from files mostly not in the page cache
#: reads with the cold-read engine (:func:`read_cold_into`, a Hugging Face directory's too).
COLD_MIN = 256 << 20


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
    *,
    follow_cache: bool = True,
) -> tuple[int, int, int]:
    """``read_ranges_into`` for files that may not be in the page cache: pieces not cached are
    read with ``O_DIRECT``, ``depth`` reads in flight (default 8), straight into an output whose
    address is congruent to its file offset modulo 4096 and through a bounce buffer otherwise;
    pieces whose pages are all cached with ``pread``, unless ``follow_cache=False`` (a load
    already judged cold: every piece from the device, so that the read-ahead a cached piece's
    ``pread`` starts cannot turn the rest of the load buffered). Returns the bytes read in
    place, bounced and from the page cache."""
    in_place, bounced, cached = _core.read_file_ranges_direct(
        paths, ranges, outs, depth, follow_cache
    )
    return int(in_place), int(bounced), int(cached)


def read_entries_direct(
    core: _core.CheckpointReader,
    infos: list[EntryInfo],
    outs: list[np.ndarray],
    verify: bool,
    threads: int | None = None,
    *,
    follow_cache: bool = True,
) -> tuple[int, int, int]:
    """The values ``infos`` of a local checkpoint (``core``) into ``outs`` (each the value's raw
    bytes), every stored byte through the cold-read engine (``follow_cache``: as for
    :func:`read_ranges_direct`), read from the shard files ``core``
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
        [i.key for i, _ in todo], [o for _, o in todo], verify, threads, _DEPTH, follow_cache
    )
    in_place, bounced, cached = got or (0, 0, 0)
    return int(in_place), int(bounced), int(cached)


def judged_cold(files: Callable[[], list[tuple[str, int]]], nbytes: int) -> bool:
    """Whether a read of ``nbytes`` from the files ``files()`` lists (``(path, size)``; called
    only for a read of at least :data:`COLD_MIN` bytes, so a small read pays nothing) should go
    through the cold-read engine: files less than half of whose pages are in the page cache
    (``cached_fraction``'s ``mincore`` sampling, weighted by file size). Warm files keep the
    buffered engine, which copies from memory faster."""
    from .io_mode import cached_fraction

    if nbytes < COLD_MIN:
        return False
    listed = files()
    size = sum(n for _, n in listed)
    return bool(size) and sum(cached_fraction(p) * n for p, n in listed) < size / 2


def read_cold_into(
    core: _core.CheckpointReader,
    keys: list[str],
    outs: list[np.ndarray],
    verify: bool,
    threads: int | None = None,
) -> bool:
    """``load_into``'s read when it pays to read with the cold-read engine (:func:`judged_cold`
    over the checkpoint's shard files, or its single file). Then the values go through the
    engine, every block from the device: compressed ones in blocks of whole chunks read with
    ``O_DIRECT`` into huge pages and decoded from there, uncompressed ones read with
    ``O_DIRECT`` in place where the target's address is congruent to the file offset and
    through the engine's bounce buffers otherwise, then checked against their crc32c (small
    neighbours share one read: ``rust/src/direct/groups.rs``). Returns whether it read
    (``False``: the caller reads everything buffered). Why: no page-cache fill, no kernel
    copy, reads deep enough to keep the device busy. A cold
    default-codec load into pre-faulted arrays ran 3.05-3.27 GB/s this way against 1.23-1.58
    buffered (docs/SERVING.md, "Issue 41 (tenth round)"); uncompressed values, bounced,
    2.71-3.04 against 0.66-0.75 ("twentieth round")."""
    if not judged_cold(core.shard_files, sum(o.nbytes for o in outs)):
        return False
    # judged cold: every block from the device (no read-ahead through the cache)
    core.read_many_into(keys, outs, verify, threads, _DEPTH, False)
    return True
