"""Whether disk offload compresses what it spills: a throughput model fed by measurements.

An offloaded tensor of ``n`` bytes is written once and read back once, both on the session's
background threads. Written raw that costs (``W``, ``R``: the scratch device's write and read
throughput)::

    raw(n)        = n / W + n / R

and written through a codec (compress throughput ``C``, decompress throughput ``D``, stored
bytes / raw bytes ``r``)::

    compressed(n) = n / C + r n / W + r n / R + n / D

Compression is chosen when ``compressed(n) < (1 - MIN_GAIN) * raw(n)``: the codec also takes
CPU time from the computation (on a CPU-only machine it competes with the model), so a
marginal modelled gain is not worth it. ``n`` cancels out: the decision is per dtype, not per
tensor size.

The figures are measured, once per process, and cached:

* ``W`` and ``R`` per filesystem (device id of the scratch directory): a 16 MiB file written
  with ``fsync`` (the sustained rate of the device, not the page cache; the cost of a tiny
  fsynced write is subtracted) and read back after dropping it from the page cache
  (``posix_fadvise(DONTNEED)``), so the read comes from the device;
* ``C``, ``D`` and ``r`` per (dtype, codec), on a sample (up to 4 MiB, four evenly spaced
  pieces) of the first tensor of that dtype that is offloaded: the sample is written through
  the store with and without the codec (not fsynced, so the difference is the codec's work,
  not the disk's) and read back.

What the model ignores: that writes and reads overlap the computation (both variants run in
the background; the cheaper one finishes sooner), the page cache absorbing short spills (the
device rate is the one that matters once spills exceed memory, which is what disk offload is
for), and the compressibility of later tensors (the first one's ratio stands for its dtype).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardpoint import storage
from shardpoint.errors import CheckpointError

__all__ = [
    "OFFLOAD_COMPRESSIONS",
    "AUTO_CODEC",
    "MIN_GAIN",
    "DiskFigures",
    "CodecFigures",
    "modelled_seconds",
    "should_compress",
    "measure_disk",
    "measure_codec",
    "CompressionChooser",
    "clear_measurements",
]

#: Values of ``offload_compression``: ``"auto"`` decides from measurements, ``"none"`` writes
#: raw, a codec name (docs/FORMAT.md §5; ``"zstd"`` is the store's per-dtype default) always
#: compresses with that codec.
OFFLOAD_COMPRESSIONS = ("auto", "none", "zstd", "zstd-plain", "zstd-bytegroup", "bytegroup-huffman")
#: The codec ``"auto"`` considers: the store's default, the best codec for each dtype.
AUTO_CODEC = "zstd"
#: Least modelled saving (fraction of the raw time) for ``"auto"`` to compress.
MIN_GAIN = 0.10

_DISK_PROBE_BYTES = 16 << 20
_SAMPLE_BYTES = 4 << 20
_TINY = 1e-9  # seconds: floor for a measured duration, so throughputs stay finite


@dataclass(frozen=True)
class DiskFigures:
    """Sustained throughput of the scratch directory's device, bytes per second."""

    write_bytes_per_s: float
    read_bytes_per_s: float


@dataclass(frozen=True)
class CodecFigures:
    """A codec on one dtype: throughputs in raw bytes per second, ``ratio`` stored / raw."""

    codec: str
    compress_bytes_per_s: float
    decompress_bytes_per_s: float
    ratio: float


def modelled_seconds(nbytes: float, disk: DiskFigures, codec: CodecFigures | None = None) -> float:
    """Modelled time to spill ``nbytes`` and read them back: raw (``codec=None``) or through
    ``codec`` (see the module docstring)."""
    io = 1 / disk.write_bytes_per_s + 1 / disk.read_bytes_per_s
    if codec is None:
        return nbytes * io
    work = 1 / codec.compress_bytes_per_s + 1 / codec.decompress_bytes_per_s
    return nbytes * (work + codec.ratio * io)


def should_compress(disk: DiskFigures, codec: CodecFigures, *, min_gain: float = MIN_GAIN) -> bool:
    """True when spilling through ``codec`` is modelled at least ``min_gain`` faster than raw."""
    return modelled_seconds(1.0, disk, codec) < (1 - min_gain) * modelled_seconds(1.0, disk)


def _write_fsynced(path: str, data: memoryview) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = data
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _read_uncached(path: str) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):  # drop the pages the write left in the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        while os.read(fd, 1 << 20):
            pass
        return time.perf_counter() - start
    finally:
        os.close(fd)


def measure_disk(directory: str, *, nbytes: int = _DISK_PROBE_BYTES) -> DiskFigures:
    """Measure the device under ``directory`` (a probe file is written there and removed)."""
    data = memoryview(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    path = os.path.join(directory, f"disk-probe-{threading.get_ident()}")
    try:
        fixed = _write_fsynced(path, data[:4096])  # latency of open + fsync, not throughput
        write = max(_write_fsynced(path, data) - fixed, _TINY)
        read = max(_read_uncached(path), _TINY)
    finally:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    return DiskFigures(write_bytes_per_s=nbytes / write, read_bytes_per_s=nbytes / read)


def sample_of(array: np.ndarray, max_bytes: int = _SAMPLE_BYTES) -> np.ndarray:
    """Up to ``max_bytes`` of ``array`` (flattened): all of it, or four evenly spaced pieces."""
    flat = array.reshape(-1)
    if flat.nbytes <= max_bytes:
        return flat
    piece = max(1, max_bytes // 4 // max(flat.itemsize, 1))
    starts = np.linspace(0, len(flat) - piece, 4).astype(np.int64)
    return np.concatenate([flat[s : s + piece] for s in starts])


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_codec(sample: np.ndarray, codec: str, directory: str) -> CodecFigures:
    """Measure ``codec`` on ``sample`` through the store, in files under ``directory``
    (removed afterwards). The codec's own work is the compressed write (read) minus ``ratio``
    times the raw write (read): what is left when the smaller byte count is accounted for."""
    nbytes = max(sample.nbytes, 1)
    prefix = os.path.join(directory, f"codec-probe-{threading.get_ident()}")

    def write(compression: str) -> None:
        with storage.Writer(prefix, compression=compression, durable=False) as writer:
            writer.add("t", sample)

    def read() -> None:
        with storage.open(prefix) as reader:
            np.array(reader.get("t"))  # a copy: every byte decoded or read

    # Interleaved, best of three: a load burst on a shared machine then inflates one sample of
    # each, not every sample of one of them.
    write_raw = read_raw = write_codec = read_codec = math.inf
    ratio = 1.0
    try:
        for _ in range(3):
            write_raw = min(write_raw, _timed(lambda: write("none")))
            read_raw = min(read_raw, _timed(read))
            write_codec = min(write_codec, _timed(lambda: write(codec)))
            read_codec = min(read_codec, _timed(read))
        with storage.open(prefix) as reader:
            info = reader.info("t")
        ratio = info.stored_bytes / info.raw_bytes if info.raw_bytes else 1.0
    finally:
        storage.remove(prefix)
    compress = max(write_codec - ratio * write_raw, _TINY)
    decompress = max(read_codec - ratio * read_raw, _TINY)
    return CodecFigures(
        codec=codec,
        compress_bytes_per_s=nbytes / compress,
        decompress_bytes_per_s=nbytes / decompress,
        ratio=ratio,
    )


# Per-process caches: the device of a scratch directory, and a codec on a dtype.
_LOCK = threading.Lock()
_DISKS: dict[int, DiskFigures] = {}
_CODECS: dict[tuple[str, str], CodecFigures] = {}


def _new_lock_in_child() -> None:
    # another thread may have held it at a fork (ARCHITECTURE.md, "Threads and fork")
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def clear_measurements() -> None:
    """Forget the cached figures (the next ``"auto"`` decision measures again)."""
    with _LOCK:
        _DISKS.clear()
        _CODECS.clear()


def disk_figures(directory: str) -> DiskFigures:
    """:func:`measure_disk` for ``directory``'s filesystem, measured once per process."""
    device = os.stat(directory).st_dev
    with _LOCK:
        hit = _DISKS.get(device)
        if hit is None:
            hit = _DISKS[device] = measure_disk(directory)
        return hit


def codec_figures(array: np.ndarray, codec: str, directory: str) -> CodecFigures:
    """:func:`measure_codec` for ``array``'s dtype, measured once per process on a sample of
    the first array that asks."""
    key = (str(array.dtype), codec)
    with _LOCK:
        hit = _CODECS.get(key)
        if hit is None:
            hit = _CODECS[key] = measure_codec(sample_of(array), codec, directory)
        return hit


class CompressionChooser:
    """The codec one offload session writes each dtype with (``"none"``: raw)."""

    def __init__(self, compression: str | None) -> None:
        choice = "none" if compression is None else compression
        if choice not in OFFLOAD_COMPRESSIONS:
            raise ValueError(
                f"offload_compression must be one of {list(OFFLOAD_COMPRESSIONS)}, got "
                f"{compression!r}"
            )
        self.compression = choice
        self._chosen: dict[str, str] = {}
        self._lock = threading.Lock()
        #: why ``"auto"`` fell back to raw, if a measurement failed
        self.probe_error: BaseException | None = None

    def codec_for(self, array: np.ndarray, directory: str) -> str:
        """The codec for ``array`` (measuring on first use of its dtype under ``"auto"``)."""
        if self.compression != "auto":
            return self.compression
        key = str(array.dtype)
        with self._lock:
            chosen = self._chosen.get(key)
            if chosen is None:
                try:
                    disk = disk_figures(directory)
                    codec = codec_figures(array, AUTO_CODEC, directory)
                except (OSError, CheckpointError) as exc:
                    # A filesystem without fsync/fadvise, or a full disk: a failed probe must
                    # not fail the training step; raw is what offload wrote before "auto".
                    self.probe_error = exc
                    chosen = "none"
                else:
                    chosen = AUTO_CODEC if should_compress(disk, codec) else "none"
                self._chosen[key] = chosen
            return chosen
