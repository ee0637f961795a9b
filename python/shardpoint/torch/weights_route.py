"""``weights_iterator(direct="auto")``: how a large local file that is not cached is read,
through the page cache (buffered reads, the read-ahead thread keeping the device busy) or with
the cold-read engine (``O_DIRECT`` straight into the iterator's recycled memory), chosen per
iteration by timing both on the first values.

Why measure instead of picking one: neither route wins everywhere, and what decides is the
machine's state, not the file. On the reference VM (docs/SERVING.md, "Issue 41 (eighth
round)"), in its first minutes after boot, a buffered cold load paid for every page-cache page
it filled with memory the host had not backed yet (1.74 system CPU-s per GB, 0.80 GB/s) and
the direct engine, which fills no page cache, ran 2.15x faster (1.72 GB/s); once the
machine's memory had been touched, buffered reads ran at 1.8-2.1 GB/s and direct ones at
1.35-1.65. A node that just started is the first case, a long-lived one the second; a fleet
running one configuration meets both. Not the default (that is ``direct="cold"``: direct for
any large cold read, no probe; docs/SERVING.md, "Issue 41 (eleventh round)"): the probe costs
5-25% of a 1 GB load (the worse route's stretch, small batches, a late read-ahead).

How: batches of at most :data:`PROBE_BATCH` while probing. The first batch goes direct,
untimed (it carries the open and the ramp-up); the next direct batches are timed until
:data:`PROBE` bytes were read; then the read-ahead starts at the next value and buffered
batches are timed the same way (the first one untimed, for its ramp-up). Direct reads the rest
only if its rate was at least :data:`DIRECT_MARGIN` times the buffered one, else buffered:
one 96 MiB stretch is a noisy measure. The margin was 1.5 while the direct engine read into
small pages (0.9-1.0 GB/s on the reference VM; with a margin of 1.25 one of five loads kept
direct and ran at half speed). Reading into huge pages, direct runs 2.4-2.6 GB/s there while
buffered swings 0.5-1.9, and the probe measured direct at 1.14-2.4x buffered in 12 of 14
Hugging Face loads (0.41x and 0.65x in the other two: docs/SERVING.md, "Issue 41 (tenth
round)"); 1.2 keeps direct where it wins by a fifth. A read call's time is what the consumer
waits for when the producer is the bottleneck, the only case where the choice matters.

What must stay true: the bytes handed out never depend on the route (both read the same
ranges, crc checked the same way); a read under :data:`AUTO_MIN` bytes, one mostly in the
page cache already (:func:`mostly_cached`: both routes would copy from memory, and the
buffered one does it faster), an object store, ``io="mmap"``, pinned memory or a reader the
direct engine cannot read is never probed (buffered).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .. import storage
from ..storage.direct_reads import local_shards_core
from ..storage.io_mode import cached_fraction

__all__ = [
    "AUTO_MIN",
    "DIRECT_MARGIN",
    "PROBE",
    "PROBE_BATCH",
    "RouteProbe",
    "cold_route",
    "local_spans",
    "mostly_cached",
    "reads_direct",
]

#: Checkpoints with fewer bytes to read than this are read buffered without a probe: the
#: probe would be most of the load, and a small file's cost is its open, not its rate.
AUTO_MIN = 512 << 20
#: Timed bytes per route: several direct batches (the engine's eight reads in flight) and a
#: dozen buffered ones, so that one slow read does not decide.
PROBE = 96 << 20
#: How much faster the direct route must have read to be kept.
DIRECT_MARGIN = 1.2
#: Raw bytes per batch while probing (the direct engine's usual batch is 64 MiB): each direct
#: value gets a placed mapping of its own, and with 64 MiB batches the probe touched ~70 MB
#: more fresh memory than a buffered load (52.6k page faults against 34.8k on the 1 GB
#: bench model, the load 14% slower in the median); with 16 MiB, 37k and 5-10%, and the
#: direct rates measured the same (0.98-1.40 GB/s against 0.90-1.31).
PROBE_BATCH = 16 << 20


class RouteProbe:
    """The state of one iteration's choice: which route the next batch takes, and once both
    were timed, the one kept (:attr:`chosen`) and the rates measured (:attr:`rates`, bytes
    per second of timed read calls)."""

    def __init__(self, probe: int | None = None) -> None:
        probe = PROBE if probe is None else probe
        if probe < 1:
            raise ValueError(f"probe must be positive, got {probe}")
        self.probe = probe
        self.route = "direct"  # the route of the next batch
        self.chosen: str | None = None
        self.rates: dict[str, float] = {}
        self._bytes = {"direct": 0, "buffered": 0}
        self._secs = {"direct": 0.0, "buffered": 0.0}
        self._warmed = {"direct": False, "buffered": False}

    def record(self, route: str, nbytes: int, seconds: float) -> str | None:
        """A batch of ``nbytes`` was read by ``route`` in ``seconds``. Returns the route of the
        next batches when that changes (``"buffered"`` once the direct probe is done, then
        the route chosen), else ``None``."""
        if self.chosen is not None or route != self.route:
            return None
        if not self._warmed[route]:  # the first batch of a route: ramp-up, not its rate
            self._warmed[route] = True
            return None
        self._bytes[route] += nbytes
        self._secs[route] += max(seconds, 0.0)
        if self._bytes[route] < self.probe:
            return None
        self.rates[route] = self._bytes[route] / max(self._secs[route], 1e-9)
        if route == "direct":
            self.route = "buffered"
            return self.route
        self.chosen = self._choose()
        self.route = self.chosen
        return self.chosen

    def _choose(self) -> str:
        """The route kept once both were timed: direct if it read at least
        :data:`DIRECT_MARGIN` times faster, else buffered."""
        clearly = self.rates["direct"] >= DIRECT_MARGIN * self.rates["buffered"]
        return "direct" if clearly else "buffered"


def local_spans(
    reader: storage.Reader, infos: Sequence[storage.EntryInfo]
) -> tuple[list[str], list[tuple[int, int, int]]] | None:
    """The files ``infos``' values lie in and each value's ``(file index, offset, stored
    length)``, for local files whose byte ranges are known: Hugging Face files (the reader
    names each value's range) and a shardpoint checkpoint's own shards; ``None`` for the rest
    (object stores, a delta, whose bytes may lie in its base)."""
    if storage.is_url(reader.path):
        return None
    ranges_of = getattr(reader, "_ranges", None)
    if ranges_of is not None:
        paths, ranges = ranges_of([i.key for i in infos])
        return paths, [(f, off, i.stored_bytes) for (f, off), i in zip(ranges, infos, strict=True)]
    if type(reader) is not storage.Reader:
        return None
    files = [os.fspath(p) for p, _ in reader._core.shard_files()]
    return files, [(i.shard, i.offset, i.stored_bytes) for i in infos if 0 <= i.shard < len(files)]


def mostly_cached(where: tuple[list[str], list[tuple[int, int, int]]] | None) -> bool:
    """Whether at least half of the bytes ``where`` (:func:`local_spans`) reads lie in files
    whose pages are in the page cache (each file's cached fraction, :func:`cached_fraction`'s
    ``mincore`` sampling, weighted by the bytes read from it): a warm file needs no probe.
    ``False`` when unknown."""
    if where is None or not where[1]:
        return False
    paths, spans = where
    need: dict[int, int] = {}
    for f, _off, n in spans:
        need[f] = need.get(f, 0) + max(n, 0)
    total = sum(need.values())
    hit = sum(cached_fraction(paths[f]) * n for f, n in need.items())
    return total > 0 and 2 * hit >= total


def cold_route(
    direct: bool | str,
    reader: storage.Reader,
    infos: Sequence[storage.EntryInfo],
    pin: bool,
    least: int,
) -> bool | str:
    """``direct`` as the iterator starts with it: ``True`` / ``False`` as given; ``"cold"``
    and ``"auto"`` buffered (``False``) unless the read is local, into pageable memory, of at
    least ``least`` stored bytes and mostly not in the page cache; then ``"auto"`` stays (the
    probe decides) and ``"cold"`` is direct, whatever the codec.

    Why compressed checkpoints too (docs/SERVING.md, "Issue 41 (twelfth round)"): the direct
    route decodes from the engine's buffers for about 0.6 CPU-s/GB against 0.75-0.86
    buffered, and on this project's VM read a cold default-codec model 1.3-1.7x as fast as
    buffered at 1 GB, 0.86-1.01x at 3.6 GB and 1.8x at 14 GB. The eleventh round kept such
    a read buffered while it fit in free memory, on 1 GB runs where direct read 0.86-1.19x
    buffered; the twelfth round's runs did not bear that out. Only a file already cached
    reads faster buffered (the check above)."""
    if direct not in ("cold", "auto"):
        return direct
    where = local_spans(reader, infos)
    stored = sum(i.stored_bytes for i in infos)
    if pin or where is None or stored < least or mostly_cached(where):
        return False
    return "auto" if direct == "auto" else True


def reads_direct(reader: storage.Reader) -> bool:
    """Whether the cold-read engine can read ``reader``'s values: Hugging Face files, or a
    local shardpoint checkpoint's own shards."""
    if hasattr(reader, "_read_direct"):
        return True
    core = reader._core if type(reader) is storage.Reader else None
    return local_shards_core(core) is not None
