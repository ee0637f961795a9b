"""Dropping files from the page cache, for tests (and benches) of cold reads."""

from __future__ import annotations

import os


def evict(*paths: str | os.PathLike[str]) -> None:
    """Drop each file's pages from the page cache (written data is synced first: the kernel
    does not drop dirty pages), so the next read comes from the device."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def takes_o_direct(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s file system opens it with ``O_DIRECT`` (tmpfs before Linux 6.6 and
    some FUSE mounts refuse it; the cold-read engine then reads with ``pread``)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    return True
