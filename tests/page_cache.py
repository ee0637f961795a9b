"""Dropping files from the page cache, for tests (and benches) of cold reads."""

from __future__ import annotations

import os
import time


def _drop(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(*paths: str | os.PathLike[str], tries: int = 3) -> bool:
    """Drop each file's pages from the page cache (written data is synced first: the kernel
    does not drop dirty pages), so the next read comes from the device.

    ``POSIX_FADV_DONTNEED`` is a hint: on a loaded CI host the kernel has kept some pages (a
    cold-read test then tested the kernel, not the reader). So the files are dropped again,
    up to ``tries`` times, until ``mincore`` sees none of their pages resident; returns whether
    that happened. A test that holds a reader to "read from the device" checks this first."""
    from shardpoint.storage.io_mode import cached_fraction

    for attempt in range(tries):
        for path in paths:
            _drop(path)
        if all(cached_fraction(p) == 0.0 for p in paths):
            return True
        time.sleep(0.1 * (attempt + 1))
    return False


def takes_o_direct(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s file system opens it with ``O_DIRECT`` (tmpfs before Linux 6.6 and
    some FUSE mounts refuse it; the cold-read engine then reads with ``pread``)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    return True
