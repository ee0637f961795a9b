"""``weights_iterator``: a checkpoint as ``(name, tensor)`` pairs, in file order, for serving
engines (vLLM's and SGLang's ``model.load_weights(iterable)``, transformers' routes).

Why an iterator and not ``load``: an engine consumes weights one at a time (it narrows each to
its tensor-parallel rank and copies it into its own parameter), so nothing but a bounded window
of values need be in host memory at once, however large the model. The window is read ahead by
one background thread (from an object store, three batches at once: see ``_REMOTE_DEPTH``)
through the bulk-load engine (``Reader._read_into`` ->
``read_many_into``: work in file order, parallel decode, ``posix_fadvise`` read-ahead, fused
read + crc32c; Hugging Face files through the same engine's plain-file path), so reading and
decoding overlap the engine's own work. A local file (Hugging Face or shardpoint) is read in
small batches (8 MiB) while a second thread (``read_ahead.py``) keeps the kernel reading 128 MiB
ahead: the device's queue never drains, and each value is copied by the consumer while still in
the CPU's cache. On the direct route (by default, ``direct="cold"``, when a large local read
is mostly not in the page cache; ``direct=True`` always) the cold-read engine reads (pieces not
cached with ``O_DIRECT``, eight reads in flight), and each value of 1 MiB or more gets a pooled
mapping placed so that its first byte sits at its file offset's place in a 4 KiB page: the
device writes it in place. ``direct="auto"`` times both routes on the first values and keeps
direct only where it clearly wins (``weights_route.py``); docs/SERVING.md, "Cold reads".

What must stay true:
- every tensor handed out owns its memory (an allocation per value, never a view of a buffer
  another value lives in, nor of a file's mapping): engines keep references (vLLM's runai test
  ``clones_reused_buffers``; fastsafetensors#95 was a lifetime bug of exactly this kind), and
  values stay valid after the iterator is closed. Values of 1 MiB or more get an anonymous
  mapping each, reused for a later value only once every reference to the earlier one is
  gone (``host_pool.py``: first touch of new memory is what the route paid for), as
  ``malloc`` reuses freed memory;
- every byte is checked (crc32c) before it is handed out, where the format has checksums
  (shardpoint checkpoints and single files; a Hugging Face directory has none);
- host memory stays bounded: values read but not yet handed out never exceed ``window`` bytes
  (a value larger than the window is read alone, once the ones before it were taken);
- ``io`` means what it means for ``sp.open`` (``"pread"`` never maps a file); whatever it
  says, the values themselves are read with ``pread`` into the tensors handed out, never
  copied out of a mapping: a copy from a mapping was 1.5-2x slower from the page cache, and a
  file shortened by another process while a value was being copied killed the process with
  SIGBUS (a check of its size before the copy cannot close that race; a ``pread`` past the
  new end returns short and is refused naming the file). ``"mmap"`` keeps the read buffered
  (never the cold-read engine).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .. import storage
from ..errors import InvalidArgumentError
from ..storage.collector import collector_paused
from ..storage.direct_reads import local_shards_core, read_entries_direct
from ..storage.io_mode import check_io
from .consumer_threads import ConsumerThreads
from .host_pool import LINE, POOL_MIN, HostPool
from .read_ahead import ReadAhead
from .weights_alloc import PAGE, own_tensor, pooled_tensor
from .weights_options import LOADER_OPTIONS, check_direct, loader_options
from .weights_plan import Names, Plan
from .weights_route import AUTO_MIN, PROBE_BATCH, RouteProbe, cold_route, local_spans, reads_direct

__all__ = [
    "WeightsIterator",
    "weights_iterator",
    "loader_options",
    "LOADER_OPTIONS",
    "DEFAULT_WINDOW",
]

#: Bytes read ahead of the consumer by default: enough for the read-ahead engine to keep a
#: device or link busy across batches, small next to any model worth an iterator.
DEFAULT_WINDOW = 256 << 20
#: Raw bytes per batch (one ``read_many_into`` call): large enough that the engine's own
#: read-ahead starts (16 MiB), small enough that several fit in the window.
_BATCH = 64 << 20

#: Raw bytes per batch from local files read ahead across batches (:class:`ReadAhead`): the device's
#: queue no longer needs large batches, and small ones keep each value's read close to the
#: consumer's copy of it (still in the CPU's cache) and the fresh memory touched small.
#: 8 MiB: the serving route ran fastest with it (docs/SERVING.md, "Issue 41, sixth round").
_AHEAD_BATCH = 8 << 20
#: File bytes hinted ahead of the batch being read (page cache, not the process's memory).
_AHEAD = 128 << 20

#: The first batch from a file: the consumer waits for all of it before its first value, and
#: nothing overlaps that read; the next batches double up to ``_BATCH``. 16 MiB: where the
#: engine's own read-ahead starts.
_FIRST_BATCH = 16 << 20

#: Batches read at once from an object store. One at a time, the link idled while a batch of
#: compressed values was decoded (the remote engine fetches a batch, then decodes it): the
#: default codec loaded no faster than uncompressed over a 150 MB/s link (docs/SERVING.md).
#: Several overlap each batch's decode with the next ones' downloads; all fit in the window.
_REMOTE_DEPTH = 3
#: Raw bytes per batch from an object store: smaller than a file's, so that decoding starts
#: soon after the bytes arrive and the first download (nothing to overlap it with) is short.
#: Measured on that link (benches/bench_link_probe.py, GB/s of raw bytes): one 64 MiB batch at
#: a time 0.16, two of 64 MiB 0.11-0.18, two of 32 MiB 0.17-0.20, three of 16 MiB 0.18-0.20.
_REMOTE_BATCH = 16 << 20

#: With ``direct``, values at least this large get a pooled mapping placed for in-place reads
#: (the pool's own threshold); smaller ones ``torch.empty``: a mapping per bias or norm would
#: cost more than it saves.
_PLACE_MIN = POOL_MIN
#: Bytes handed out before the consumer gives them back to the window (and wakes the
#: producer): small next to any window, so the bound stays what it says.
_RELEASE = 1 << 20


class _Producer:
    """The read-ahead: one thread reading batches in file order, within the window, handed to
    the consumer through ``_ready``. It holds what that thread touches and nothing of the
    :class:`WeightsIterator`, so that the iterator's lifetime is its consumer's."""

    def __init__(
        self,
        reader: storage.Reader,
        plan: Plan,
        direct: bool | str,
        threads: int | None,
        verify: bool,
        window: int,
        pin: bool,
    ) -> None:
        self._reader = reader
        self._plan = plan
        # direct="auto": the route is timed on the first values (weights_route.py); until
        # then, and after, `_direct` is the route of the batch being read
        self._probe = RouteProbe() if direct == "auto" else None
        self._direct = direct is True or (self._probe is not None and self._probe.route == "direct")
        self._started = 0  # values whose reads have started (where a late read-ahead begins)
        #: the direct route reads pieces it finds all cached from the cache (set by the iterator)
        self.follow_cache = True
        self._threads = threads
        self._verify = bool(verify)
        self._window = window
        self._pin = pin
        # large values in recycled mappings (host_pool.py: first touch of new memory is what
        # capped this route); pinned memory is the CUDA allocator's own
        self._pool = None if pin else HostPool(self._pool_room)
        self._cond = threading.Condition()
        self._ready: deque[tuple[list[storage.EntryInfo], list[torch.Tensor]] | BaseException] = (
            deque()
        )
        self._inflight = 0  # bytes read (or being read) and not yet handed out
        self._stop = False
        self._done = False
        self._ahead: ReadAhead | None = None  # the read-ahead across batches, while reading

    def _pool_room(self) -> int:
        """Bytes the pool may keep free: the window less what is read ahead (a benign race:
        one int read without the lock)."""
        return max(0, self._window - self._inflight)

    def _places(self, info: storage.EntryInfo) -> bool:
        """Whether ``info``'s value gets a placed mapping of its own (``direct``; not for a
        compressed value, which is decoded from the engine's buffers, not read in place)."""
        return (
            self._direct and not self._pin and info.codec == "none" and info.raw_bytes >= _PLACE_MIN
        )

    def _start_ahead(self, skip: int = 0) -> ReadAhead | None:
        """The read-ahead across batches, for local files whose byte ranges are known
        (:func:`local_spans`); ``None`` for the rest (the engine's per-call read-ahead). It
        starts at the ``skip``-th value (those before were read already)."""
        if self._direct:
            return None
        where = local_spans(self._reader, self._plan.infos[skip:])
        return None if where is None else ReadAhead(*where, _AHEAD)

    def _limit(self, remote: bool) -> int:
        """Raw bytes of the next batch, for the route it takes (two fit in the window: one
        being handed out while the next is read)."""
        limit = _REMOTE_BATCH if remote else _AHEAD_BATCH if self._ahead else _BATCH
        if self._probe is not None and self._probe.chosen is None:
            limit = min(limit, PROBE_BATCH)  # probing: direct batches small (weights_route.py)
        return min(limit, max(1, self._window // 2))

    def _read_timed(self, batch: list[storage.EntryInfo]) -> list[torch.Tensor]:
        """:meth:`_read_batch`, timed for the route probe (``direct="auto"``), which may
        switch the route of the next batches: to buffered (the read-ahead starts at the next
        value) once the direct route was timed, then to the route chosen."""
        probe = self._probe
        if probe is None or probe.chosen is not None:
            return self._read_batch(batch)
        route = "direct" if self._direct else "buffered"
        t0 = time.perf_counter()
        out = self._read_batch(batch)
        nbytes = sum(i.stored_bytes for i in batch)
        switch = probe.record(route, nbytes, time.perf_counter() - t0)
        if switch == "buffered" and self._direct:
            self._direct = False
            self._ahead = self._start_ahead(self._started)
        elif switch == "direct":
            self._direct = True
            if self._ahead is not None:  # what it hinted is read from the page cache
                self._ahead.close()
                self._ahead = None
        return out

    def _read_batch(self, batch: list[storage.EntryInfo]) -> list[torch.Tensor]:
        pool = self._pool
        if self._ahead is not None:
            self._ahead.advance(sum(i.stored_bytes for i in batch))
        # with `direct`, large values sit at their file offset's page offset in a pooled
        # mapping (the device writes them in place; a fresh mapping per value cost a page
        # fault per 4 KiB: docs/SERVING.md, "Issue 41 (seventh round)")
        # the batch's tensors, kept until handed out: made with the collector paused
        # (storage/collector.py; a batch of small values is thousands of objects)
        with collector_paused():
            made = [
                pooled_tensor(i, pool, PAGE)
                if pool is not None and self._places(i)
                else pooled_tensor(i, pool, LINE if i.codec == "none" else 0)
                if pool is not None and i.raw_bytes >= POOL_MIN
                else own_tensor(i, self._pin)
                for i in batch
            ]
            # the reads land in each value's bytes (a flat `uint8` array made with the tensor)
            keys: list[str] = []
            infos: list[storage.EntryInfo] = []
            bufs: list[np.ndarray] = []
            for info, (_, raw) in zip(batch, made, strict=True):
                if info.raw_bytes:
                    keys.append(info.key)
                    infos.append(info)
                    bufs.append(raw)
            out = [t for t, _ in made]
        if pool is not None:
            pool.trim()  # this batch is now counted in the window: keep the pool within it
        if keys and self._direct and hasattr(self._reader, "_read_direct"):
            self._reader._read_direct(keys, bufs, follow_cache=self.follow_cache)
        elif keys and self._direct:  # a local shardpoint checkpoint (reads_direct)
            core = local_shards_core(self._reader._core)
            assert core is not None
            read_entries_direct(
                core, infos, bufs, self._verify, self._threads, follow_cache=self.follow_cache
            )
        elif keys:
            # buffered as chosen (``direct=False``, or a warm load): never re-judged cold
            self._reader._read_into(keys, bufs, self._verify, self._threads, buffered=True)
        return out

    def run(self) -> None:
        # an object store: reads overlap (see _REMOTE_DEPTH); a file: one read at a time (its
        # engine reads ahead by itself)
        remote = storage.is_url(self._reader.path)
        depth = _REMOTE_DEPTH if remote else 1
        pool = ThreadPoolExecutor(depth, "shardpoint-weights-read") if depth > 1 else None
        # batches being read, oldest first; handed out in that order
        reading: deque[tuple[list[storage.EntryInfo], Future[list[torch.Tensor]]]] = deque()

        def hand_over_oldest() -> None:
            batch, fut = reading.popleft()
            tensors = fut.result()
            with self._cond:
                self._ready.append((batch, tensors))
                self._cond.notify_all()

        try:
            if not remote:
                self._ahead = self._start_ahead()
            first = None if remote else min(self._limit(remote), _FIRST_BATCH)
            for batch in self._plan.batches(lambda: self._limit(remote), first):
                size = sum(i.raw_bytes for i in batch)
                while True:
                    with self._cond:
                        if self._stop:
                            return
                        if not self._inflight or self._inflight + size <= self._window:
                            self._inflight += size
                            break
                        if not reading:
                            self._cond.wait()  # the consumer frees window as it takes values
                            continue
                    hand_over_oldest()  # outside the lock: may wait for its read
                self._started += len(batch)
                if pool is None:
                    tensors = self._read_timed(batch)
                    with self._cond:
                        self._ready.append((batch, tensors))
                        self._cond.notify_all()
                    continue
                reading.append((batch, pool.submit(self._read_batch, batch)))
                # at most `depth` reads at once; finished ones handed out as soon as they are
                while len(reading) >= depth or (reading and reading[0][1].done()):
                    hand_over_oldest()
            while reading:
                hand_over_oldest()
        except BaseException as e:  # handed to the consumer, raised there
            with self._cond:
                self._ready.append(e)
                self._cond.notify_all()
        finally:
            if self._ahead is not None:
                self._ahead.close()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            with self._cond:
                self._done = True
                self._cond.notify_all()


class WeightsIterator:
    """Iterator of ``(name, tensor)`` over a checkpoint; see :func:`weights_iterator`.

    Also a context manager; :meth:`close` stops the read-ahead (values already handed out stay
    valid). After the end, :attr:`bytes_read` (stored bytes read), :attr:`raw_bytes` (bytes
    handed out) and :attr:`seconds` (open to last value) say what the load cost."""

    def __init__(
        self,
        path: str | os.PathLike[str] | storage.Reader,
        *,
        names: Names = None,
        device: str | torch.device = "cpu",
        threads: int | None = None,
        io: str = "auto",
        verify: bool = True,
        window: int = DEFAULT_WINDOW,
        storage_options: Mapping[str, Any] | None = None,
        direct: bool | str = "cold",
        consumer_threads: int | None = 1,
    ) -> None:
        check_io(io)
        direct = check_direct(direct)
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise InvalidArgumentError(f"threads must be a positive int or None, got {threads!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise InvalidArgumentError(f"window must be a positive number of bytes, not {window!r}")
        if consumer_threads is not None and (
            isinstance(consumer_threads, bool)
            or not isinstance(consumer_threads, int)
            or consumer_threads < 1
        ):
            raise InvalidArgumentError(
                f"consumer_threads must be a positive int or None, got {consumer_threads!r}"
            )
        self._consumer_threads = consumer_threads
        self._threads_limit = ConsumerThreads()
        self._t0 = time.perf_counter()
        self.device = torch.device(device)
        self._owned = not isinstance(path, storage.Reader)
        if not isinstance(path, storage.Reader):  # ours: bf16/fp8 as torch views them, no ml_dtypes
            path = storage.open(path, io=io, storage_options=storage_options)
            path._carry = True
        self._reader = path
        try:
            self._plan = Plan(self._reader, names)
        except BaseException:
            self.close()
            raise
        # the cold-read engine: Hugging Face files (pinned memory through its bounce buffer),
        # a local shardpoint checkpoint's own shards (not a delta's, not a single file); "cold"
        # and "auto" only for large local reads into pageable memory mostly not in the page
        # cache (weights_route.py): a warm file is copied faster out of the cache
        if direct and (io == "mmap" or not reads_direct(self._reader)):
            direct = False
        # pinned host memory makes the copy to an accelerator a DMA (and non-blocking)
        self._pin = self.device.type == "cuda" and torch.cuda.is_available()
        # only direct=True reads pieces it finds cached from the cache: "cold" and "auto" chose
        # the engine for cold files (rust/src/direct.rs, DirectFile::follow_cache: why)
        follow_cache = direct is True
        direct = cold_route(direct, self._reader, self._plan.infos, self._pin, AUTO_MIN)
        self._p = _Producer(self._reader, self._plan, direct, threads, verify, window, self._pin)
        self._p.follow_cache = follow_cache
        self.bytes_read = 0
        self.raw_bytes = 0
        self.seconds = 0.0
        # the batch being handed out, as three lists (no tuple per value: with thousands of
        # small values waiting, those tuples lived long enough for Python's full collections,
        # each ~0.1 s with torch imported: docs/SERVING.md, "Issue 41 (twenty-fourth round)");
        # a tensor's slot is emptied as it is handed out
        self._names: list[str] = []
        self._outs: list[torch.Tensor | None] = []
        self._sizes: list[int] = []
        self._at = 0
        self._freed = 0  # bytes handed out whose window is not yet given back
        # the thread holds the producer, never this iterator: an iterator its consumer drops
        # (a `break` out of its loop) is freed, and so closed, in the consumer's thread
        self._thread = threading.Thread(target=self._p.run, name="shardpoint-weights", daemon=True)
        self._thread.start()

    @property
    def _pool(self) -> HostPool | None:
        """The producer's recycled host memory (None for pinned memory)."""
        return self._p._pool

    @property
    def route(self) -> str:
        """How the file is being read: ``"direct"`` (the cold-read engine), ``"buffered"``, or
        with ``direct="auto"`` the route of the batch being read until the probe chose
        (``"probing: direct"``, ``"probing: buffered"``)."""
        p = self._p
        now = "direct" if p._direct else "buffered"
        return now if p._probe is None or p._probe.chosen is not None else f"probing: {now}"

    @property
    def probe_rates(self) -> dict[str, float]:
        """With ``direct="auto"``: bytes per second of each route's timed reads (empty until
        timed; both once the route was chosen)."""
        return {} if self._p._probe is None else dict(self._p._probe.rates)

    @property
    def _inflight(self) -> int:
        """Bytes read (or being read) and not yet handed out."""
        return self._p._inflight

    # --- the consumer ------------------------------------------------------------------------
    def __iter__(self) -> WeightsIterator:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        if self._consumer_threads is not None and not self._p._stop:
            # the consumer's intra-op threads, lowered for as long as it takes values (the first
            # call in the thread that iterates; restored at the end, on close() and on any error)
            self._threads_limit.lower(self._consumer_threads)
        try:
            while self._at >= len(self._names):
                self._next_batch()
        except BaseException:
            self._threads_limit.restore()
            raise
        k = self._at
        self._at = k + 1
        t = self._outs[k]
        self._outs[k] = None
        nbytes = self._sizes[k]
        if nbytes:
            self._freed += nbytes
            if self._freed >= _RELEASE or self._at == len(self._names):
                self._release()
        assert t is not None
        return self._names[k], t

    def _release(self) -> None:
        """Give the window back what was handed out (one lock and wake-up per ``_RELEASE``
        bytes or batch, not per value: 20,000 small values took 20,000 of each)."""
        freed, self._freed = self._freed, 0
        with self._p._cond:
            self._p._inflight -= freed
            self._p._cond.notify_all()

    def _next_batch(self) -> None:
        if self._freed:
            self._release()  # before waiting: the producer may be waiting for this room
        with self._p._cond:
            while not self._p._ready and not self._p._done and not self._p._stop:
                self._p._cond.wait()
            item = self._p._ready.popleft() if self._p._ready else None
        if item is None:
            self._finish()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, tensors = item
        plan = self._plan
        plain = not plan.followers  # each value under its own key only
        names: list[str] = []
        outs: list[torch.Tensor | None] = []
        sizes: list[int] = []
        for info, t in zip(batch, tensors, strict=True):
            self.bytes_read += info.stored_bytes
            self.raw_bytes += info.raw_bytes
            if self.device.type != "cpu":
                t = t.to(self.device, non_blocking=self._pin)
            if plain:
                names.append(info.key)
                outs.append(t)
                sizes.append(info.raw_bytes)
                continue
            tied = plan.names_of(info.key)
            for j, n in enumerate(tied):
                # the window counts each value once, when its last name is handed out
                names.append(n)
                outs.append(t)
                sizes.append(info.raw_bytes if j == len(tied) - 1 else 0)
        self._names, self._outs, self._sizes, self._at = names, outs, sizes, 0

    def _finish(self) -> None:
        if not self.seconds:
            self.seconds = time.perf_counter() - self._t0
        self.close()

    def close(self) -> None:
        """Stop reading ahead and release the checkpoint (values handed out stay valid), and
        give the consuming thread its intra-op thread count back (called from another thread,
        that happens at the consumer's next ``next()``, which ends the iteration)."""
        limit = getattr(self, "_threads_limit", None)
        if limit is not None:
            limit.restore()
        prod = getattr(self, "_p", None)
        if prod is not None:
            with prod._cond:
                prod._stop = True
                prod._cond.notify_all()
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join()
            self._p._ready.clear()
            self._names, self._outs, self._sizes, self._at = [], [], [], 0
        prod = getattr(self, "_p", None)
        if prod is not None and prod._pool is not None:
            prod._pool.close()
        if self._owned and getattr(self, "_reader", None) is not None:
            self._reader.close()

    def __enter__(self) -> WeightsIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to release
            pass


def weights_iterator(
    path: str | os.PathLike[str] | storage.Reader,
    *,
    names: Names = None,
    device: str | torch.device = "cpu",
    threads: int | None = None,
    io: str = "auto",
    verify: bool = True,
    window: int = DEFAULT_WINDOW,
    storage_options: Mapping[str, Any] | None = None,
    direct: bool | str = "cold",
    consumer_threads: int | None = 1,
) -> WeightsIterator:
    """``(name, tensor)`` for every tensor of a checkpoint, in file order.

    Args:
        path: a shardpoint checkpoint prefix (or ``s3://``... URL), a single-file checkpoint,
            a directory ``shardpoint export`` wrote, a Hugging Face model directory, its index
            JSON or one ``.safetensors`` file, or a reader already open.
        names: only these names (a collection: a name absent from the checkpoint raises
            ``KeyError``), or the names a predicate accepts. Default: every tensor.
        device: where tensors are handed out; values are read into (pinned, for CUDA) host
            memory and copied there.
        threads: decoding threads (default: one per CPU).
        io: ``"auto"``, ``"mmap"`` or ``"pread"``, as for ``sp.open``.
        verify: check the crc32c of uncompressed values too (compressed ones always are).
        window: bytes read ahead of the consumer at most.
        storage_options: credentials/endpoint for object-store URLs.
        direct: read Hugging Face safetensors files and a local shardpoint checkpoint
            with the cold-read engine (``O_DIRECT`` for pages not cached, eight reads in
            flight, into huge pages; uncompressed values straight into each tensor, crc32c
            checked over the bytes landed with ``verify``; compressed ones decoded from the
            engine's buffers): no page-cache fill, no kernel copy. ``"cold"`` (the default):
            direct for a local read of 512 MiB or more into pageable memory whose files are
            mostly not in the page cache (``mincore``), else buffered (a cached file is copied
            faster out of the cache; ``weights_route.cold_route``). On this project's VM a
            14 GB model read cold 1.4x faster direct (Hugging Face) and 1.8x (default codec),
            with a fifth of the system CPU; a 1 GB default-codec one 1.3-1.7x (docs/SERVING.md,
            "Issue 41 (eleventh round)", "(twelfth round)"). ``True`` / ``False`` force a
            route. ``"auto"``: for such a cold read, both routes are timed on the first values
            (96 MiB each) and direct is kept only if it read at least 1.2x faster
            (:attr:`WeightsIterator.route`, :attr:`WeightsIterator.probe_rates`).
        consumer_threads: torch's intra-op threads in the thread that takes the values, from
            its first ``next()`` until the iterator ends, is closed or raises (then the
            thread's own count comes back exactly). Default 1: the consumer's per-tensor
            ``copy_`` then stays on its own thread, and torch's OpenMP workers sleep instead of
            spinning on the cores the reads need (docs/SERVING.md, "Issue 41, fifth round").
            ``None`` leaves torch's setting alone.

    Each tensor owns its memory and stays valid after the iterator is closed. Names tied to a
    stored tensor by ``sptorch.save`` are handed out too, as the same tensor. A damaged value
    raises ``ChecksumMismatchError`` naming its key and file when it is reached.
    """
    return WeightsIterator(
        path,
        names=names,
        device=device,
        threads=threads,
        io=io,
        verify=verify,
        window=window,
        storage_options=storage_options,
        direct=direct,
        consumer_threads=consumer_threads,
    )
