"""One CheckpointManager process per directory: an exclusive ``flock`` on the directory itself.

Two jobs resumed from one checkpoint by mistake would both number, write and delete checkpoints
in one directory; their retention sweeps then delete each other's checkpoints. The first manager
of a directory in a process opens the directory and takes an exclusive, non-blocking ``flock``
on it, held for as long as any manager of that directory lives in the process; a manager in
another process then gets :class:`DirectoryInUseError` naming the directory (Orbax and TF users
expect the second job to be told). Managers of one directory in one process (a training loop
that builds a new manager to resume) share the one descriptor, so they never conflict; the lock
dies with the process, so a killed job never leaves the directory locked, and no lock file is
left in the directory.

Where the file system has no locks (``ENOLCK``/``ENOSYS``/``EOPNOTSUPP``), the manager works as
before and logs a warning: the commit lock of each checkpoint still keeps every checkpoint
intact, but two managers may then delete each other's checkpoints.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading

from .errors import DirectoryInUseError

__all__ = ["DirectoryLease", "acquire"]

logger = logging.getLogger("shardpoint")

#: "no usable flock here" (EBADF: NFS emulates flock with write locks, refused on a directory)
_NO_LOCKS = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.EBADF}
_mutex = threading.Lock()


def _new_mutex_in_child() -> None:
    # another thread may have held it at a fork (ARCHITECTURE.md, "Threads and fork")
    global _mutex
    _mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_mutex_in_child)
#: (device, inode) of a locked directory -> [fd, number of live leases]
_held: dict[tuple[int, int], list[int]] = {}


class DirectoryLease:
    """A share of this process's lock on one directory; ``release()`` (idempotent) gives it back
    and the last lease of the directory closes the descriptor, dropping the lock."""

    def __init__(self, key: tuple[int, int] | None) -> None:
        self._key = key

    def release(self) -> None:
        with _mutex:
            key, self._key = self._key, None
            if key is None or key not in _held:
                return
            _held[key][1] -= 1
            if _held[key][1] == 0:
                fd = _held.pop(key)[0]
                os.close(fd)


def acquire(directory: str, user: str = "a CheckpointManager") -> DirectoryLease:
    """Lock ``directory`` (created if missing) for this process, or raise DirectoryInUseError
    if a manager in another process holds it (``user``: what the message calls that manager;
    a CheckpointManager and a TieredCheckpointManager share the lock)."""
    os.makedirs(directory or ".", exist_ok=True)
    st = os.stat(directory or ".")
    key = (st.st_dev, st.st_ino)
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return DirectoryLease(key)
        fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DirectoryInUseError(
                    f"{directory}: another process has {user} on this directory "
                    "(it holds the directory's lock); two jobs saving into one directory would "
                    "delete each other's checkpoints. Stop the other job or give this one its "
                    "own directory"
                ) from None
            if e.errno in _NO_LOCKS:
                logger.warning(
                    "%s: file locks are not supported here (%s); cannot detect a second "
                    "CheckpointManager on this directory",
                    directory,
                    os.strerror(e.errno),
                )
                return DirectoryLease(None)
            raise
        _held[key] = [fd, 1]
        return DirectoryLease(key)
