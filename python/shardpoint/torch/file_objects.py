"""File objects for :func:`shardpoint.torch.save` / :func:`shardpoint.torch.load`, as
``torch.save`` / ``torch.load`` take them (``io.BytesIO``, a file opened ``"wb"``/``"rb"``).

A stream holds the single-file form of a checkpoint (FORMAT.md §10). Saving writes that file
in a private temp directory and copies it into the stream. Loading opens the stream's file in
place when it is a regular file read from its start (zero-copy views of its pages, as for a
path); any other readable stream is read from its current position into an anonymous
in-memory file (``memfd``), which the loaded tensors then view without another copy.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CheckpointError, CorruptCheckpointError, InvalidArgumentError

__all__ = ["describe_stream", "is_file_object", "save_to_stream", "stream_path"]

_COPY_BYTES = 16 << 20


def is_file_object(f: Any) -> bool:
    """Whether ``f`` is a file object rather than a path."""
    return not isinstance(f, str | bytes | os.PathLike) and (
        hasattr(f, "write") or hasattr(f, "read")
    )


def save_to_stream(write: Callable[[str], None], f: Any) -> None:
    """Run ``write(path)`` (a single-file save) into a private temp file and copy it into the
    writable stream ``f`` at its current position."""
    if not callable(getattr(f, "write", None)):
        raise InvalidArgumentError(f"cannot save to {type(f).__name__}: it has no write()")
    with tempfile.TemporaryDirectory(prefix="shardpoint-save-") as d:
        path = os.path.join(d, "checkpoint.sp")
        write(path)
        with open(path, "rb") as src:
            shutil.copyfileobj(src, f, _COPY_BYTES)
    flush = getattr(f, "flush", None)
    if callable(flush):
        flush()


def _regular_fd(f: Any) -> int | None:
    try:
        fd = f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    try:
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None


def _same_bytes(f: Any, fd: int) -> bool:
    """Whether the stream's first bytes are the file descriptor's: a decompressing reader
    (``gzip.open``) reports the underlying file's ``fileno()``, which holds other bytes."""
    try:
        head = f.read(16)
        f.seek(0)
        return bool(os.pread(fd, len(head), 0) == head)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


@contextlib.contextmanager
def stream_path(f: Any) -> Iterator[str]:
    """A path the core can open that holds the checkpoint in readable stream ``f`` (from its
    current position). The stream is left after the checkpoint's bytes.

    An error raised while the path is in use names the stream (its file name, or its type), not
    the private path (``/proc/self/fd/N``, a temp file) that would mean nothing to the user."""
    if not callable(getattr(f, "read", None)):
        raise InvalidArgumentError(f"cannot load from {type(f).__name__}: it has no read()")
    fd = _regular_fd(f)
    start = f.tell() if fd is not None and f.seekable() else None
    if fd is not None and start == 0 and not _same_bytes(f, fd):
        fd = None  # gzip/bz2/lzma.open: fileno() is the compressed file's, not these bytes
    if fd is not None and start == 0 and os.path.isdir("/proc/self/fd"):
        with _named(f"/proc/self/fd/{fd}", f) as path:
            yield path
        f.seek(0, os.SEEK_END)
        return
    if isinstance(f, io.BytesIO):
        pos = f.tell()
        f.seek(0, os.SEEK_END)
        with f.getbuffer() as whole, whole[pos:] as rest, _spill(rest) as spilled:
            with _named(spilled, f) as path:
                yield path
        return
    with _spill(memoryview(f.read())) as spilled, _named(spilled, f) as path:
        yield path


def describe_stream(f: Any) -> str:
    """How errors name a file object: its file name when it has one, else its type."""
    name = getattr(f, "name", None)
    if isinstance(name, str | bytes | os.PathLike) and not isinstance(name, int):
        return os.fsdecode(name)
    return f"<{type(f).__module__}.{type(f).__qualname__} stream>"


@contextlib.contextmanager
def _named(path: str, f: Any) -> Iterator[str]:
    """Yield ``path``; a shardpoint error raised meanwhile has ``path`` in its message replaced
    by :func:`describe_stream` of ``f`` (same exception object, class and traceback)."""
    try:
        yield path
    except CheckpointError as e:
        if e.args and isinstance(e.args[0], str) and path in e.args[0]:
            e.args = (e.args[0].replace(path, describe_stream(f)), *e.args[1:])
        raise


@contextlib.contextmanager
def _spill(data: memoryview) -> Iterator[str]:
    """A path holding ``data``: an anonymous in-memory file where the OS has them."""
    if not len(data):
        raise CorruptCheckpointError("the stream is empty (no checkpoint)")
    if hasattr(os, "memfd_create"):
        mfd = os.memfd_create("shardpoint-load", os.MFD_CLOEXEC)
        try:
            with open(mfd, "wb", closefd=False) as w:
                w.write(data)
            data.release()
            yield f"/proc/self/fd/{mfd}"
        finally:
            os.close(mfd)
        return
    with tempfile.TemporaryDirectory(prefix="shardpoint-load-") as d:
        path = os.path.join(d, "checkpoint.sp")
        with open(path, "wb") as w:
            w.write(data)
        data.release()
        yield path
