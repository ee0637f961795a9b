"""Temp files for atomic replaces, created the way every other file of a checkpoint is.

``tempfile.mkstemp`` creates files with mode 0600 whatever the umask, so a file renamed into
place from it (the manager's state file, a converted ``.safetensors``) could not be read by the
other users who can read the shards and index beside it. These helpers create with mode 0666
and let the umask decide, exactly like ``open(path, "w")`` and the Rust core.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets

__all__ = ["create_temp", "fsync_dir", "try_lock_exclusive", "make_dirs"]

#: errnos meaning "this file system has no flock" (Lustre noflock, some FUSE/NFS setups)
_NO_LOCKS = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL}


def make_dirs(directory: str) -> None:
    """Create ``directory`` and its missing parents, as every writer does for its destination
    (TensorFlow's ``Checkpoint.save`` and Orbax do too). Errors name ``directory``."""
    if not directory or os.path.isdir(directory):
        return
    from ..errors import CheckpointIOError

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CheckpointIOError(
            f"{directory}: cannot create the destination directory: {e.strerror or e}"
        ) from e


def create_temp(directory: str, prefix: str, suffix: str) -> tuple[int, str]:
    """Create a new, empty file ``directory/prefix<random>suffix`` (O_EXCL, mode 0666 minus
    the umask) and return its descriptor (write-only) and path."""
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(8)}{suffix}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        return fd, path
    raise FileExistsError(errno.EEXIST, "no free temp file name", directory)


def try_lock_exclusive(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` (blocking). Returns False, instead of failing,
    where the file system does not support locks: callers use the lock only as a hint."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        if e.errno in _NO_LOCKS:
            return False
        raise
    return True


def fsync_dir(directory: str, *, strict: bool = True) -> None:
    """Make the renames in ``directory`` durable. ``strict=False``: a file system that cannot
    open or sync a directory is not an error (the rename itself happened)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)
