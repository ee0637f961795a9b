"""The cold-read engine's Python face (docs/SERVING.md "Cold reads"): ranges of plain files
read with ``O_DIRECT`` where their pages are not cached, and a local checkpoint's values read
that way (uncompressed ones checked against their crc32c after they land)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _core
from .entry_stats import EntryInfo

__all__ = [
    "COLD_MIN",
    "alongside",
    "DIRECT_VALUE_MIN",
    "SMALL_MANY",
    "judged_cold",
    "overlapping",
    "read_cold_into",
    "read_entries_direct",
    "read_ranges_direct",
    "split_for_engine",
    "split_small",
]

#: Direct reads in flight for compressed values (the engine's default, as for plain ranges).
_DEPTH = 8
#: A ``load_into`` read of at least this many bytes from files mostly not in the page cache
#: reads with the cold-read engine (:func:`read_cold_into`, a Hugging Face directory's too).
COLD_MIN = 256 << 20
#: On a cold read, values smaller than this are read buffered, not by the engine
#: (:func:`split_small`), ...
DIRECT_VALUE_MIN = 1 << 20
#: ... when there are at least this many of them.
SMALL_MANY = 1024


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
    through the engine's bounce buffers otherwise, then checked against their crc32c; many
    small values are read buffered, alongside (:func:`split_small`, :func:`alongside`).
    Returns whether it read (``False``: the caller reads everything buffered). Why: no
    page-cache fill, no kernel copy, reads deep enough to keep the device busy. A cold
    default-codec load into pre-faulted arrays ran 3.05-3.27 GB/s this way against 1.23-1.58
    buffered (docs/SERVING.md, "Issue 41 (tenth round)"); uncompressed values, bounced,
    2.71-3.04 against 0.66-0.75 ("twentieth round")."""
    if not judged_cold(core.shard_files, sum(o.nbytes for o in outs)):
        return False
    parts = split_for_engine(keys, outs)
    if parts is None:
        return False  # (one buffered call refuses overlapping outputs, naming them)
    (lk, lo), (sk, so) = parts
    alongside(
        # judged cold: every block from the device (no read-ahead through the cache)
        (lambda: core.read_many_into(lk, lo, verify, threads, _DEPTH, False)) if lk else None,
        (lambda: core.read_many_into(sk, so, verify, threads)) if sk else None,
    )
    return True


def alongside(main: Callable[[], object] | None, side: Callable[[], object] | None) -> None:
    """Run ``side`` on a helper thread while ``main`` runs here, wait for both, and raise the
    first error (``main``'s first); either may be ``None`` (nothing to run, no thread). Why: a
    cold load's many small values, read buffered, wait on the device as the engine's reads do
    (both with the GIL released); one after the other, the load would pay both waits."""
    if main is None or side is None:
        for only in (main, side):
            if only is not None:
                only()
        return
    with ThreadPoolExecutor(1, "shardpoint-small-values") as pool:
        fut = pool.submit(side)
        try:
            main()
        finally:
            err = fut.exception()  # waits: the side read never outlives the call
        if err is not None:
            raise err


def split_small(outs: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """The places in ``outs`` of values for the cold-read engine and of those read buffered:
    values under :data:`DIRECT_VALUE_MIN` bytes go buffered when there are at least
    :data:`SMALL_MANY` of them; otherwise everything goes to the engine. Why: the engine reads
    each value by itself, a small one costing a device round trip (eight in flight), so 20,000
    values of 2 KiB (40 MB) read at 0.08 GB/s that way against 0.39-0.48 buffered, where the
    kernel's read-ahead takes many neighbours per request; but a model's few hundred norms and
    biases, each between two large tensors, cost a 1 GB load 7-25% more read buffered (even
    alongside the engine) than through it (docs/SERVING.md, "Issue 41 (twentieth round)")."""
    small = [i for i, o in enumerate(outs) if o.nbytes < DIRECT_VALUE_MIN]
    if len(small) < SMALL_MANY:
        return list(range(len(outs))), []
    aside = set(small)
    return [i for i in range(len(outs)) if i not in aside], small


def split_for_engine(
    keys: list[str], outs: list[np.ndarray]
) -> tuple[tuple[list[str], list[np.ndarray]], tuple[list[str], list[np.ndarray]]] | None:
    """``(keys, outs)`` for the engine and for the buffered read (:func:`split_small`), or
    ``None`` when targets of the two overlap (two calls would not see it: the caller makes
    one buffered call, which refuses them by name)."""
    large, small = split_small(outs)
    if large and small and overlapping(outs):
        return None
    return ([keys[i] for i in large], [outs[i] for i in large]), (
        [keys[i] for i in small],
        [outs[i] for i in small],
    )


def overlapping(outs: list[np.ndarray]) -> bool:
    """Whether any two of ``outs`` share a byte (two calls would not see it; one refuses it)."""
    spans = sorted((o.ctypes.data, o.nbytes) for o in outs if o.nbytes)
    return any(a + n > b for (a, n), (b, _) in zip(spans, spans[1:], strict=False))
