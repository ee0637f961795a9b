"""A read-ahead that outlives the weights iterator's batches.

Why: the bulk-load engine reads ahead (``posix_fadvise(WILLNEED)``) only within the call it
serves, so when the iterator reads a file in batches the device's queue drains at the end of
every batch and ramps up again at the start of the next. This thread asks the kernel for the
bytes of the next values (at most ``ahead`` bytes beyond what the iterator has started to
read) for the whole iteration, so the device stays busy across batches while the iterator's
own batches (and so the fresh memory it touches, and the distance between a value's read and
the consumer's copy of it) stay small: the pages read ahead are the kernel's page cache, not
the process's memory, and they are dropped under pressure like any cached file page.

What must stay true: it only hints (a failed or refused hint loses nothing but speed), it
never runs more than ``ahead`` bytes beyond :meth:`advance`'s position, and :meth:`close`
stops it and closes its file before returning.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

__all__ = ["ReadAhead", "PIECE"]

#: Bytes per hint: the engine's own read-ahead piece (``rust/src/load.rs``, ``AHEAD_PIECE``).
PIECE = 8 << 20


def pieces(spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(file, offset, length)`` spans in read order, adjacent ones of a file merged and the
    result cut into hints of at most :data:`PIECE` bytes."""
    merged: list[list[int]] = []
    for f, off, n in spans:
        if n <= 0:
            continue
        last = merged[-1] if merged else None
        if last is not None and last[0] == f and last[1] + last[2] == off:
            last[2] += n
        else:
            merged.append([f, off, n])
    out: list[tuple[int, int, int]] = []
    for f, off, n in merged:
        for start in range(off, off + n, PIECE):
            out.append((f, start, min(PIECE, off + n - start)))
    return out


class ReadAhead:
    """Hints ``spans`` (``(file index, offset, length)`` of ``paths``, in the order they will
    be read) to the kernel on a thread of its own, at most ``ahead`` bytes beyond the bytes
    :meth:`advance` has reported.

    The thread holds one file open at a time (the one it is hinting; the spans walk the files
    one after another): a checkpoint may have thousands of shard files, and a descriptor for
    each, beside the reader's own, could exhaust the process's limit."""

    def __init__(
        self, paths: Sequence[str], spans: Sequence[tuple[int, int, int]], ahead: int
    ) -> None:
        self._paths = list(paths)
        self._pieces = pieces(spans)
        self._ahead = ahead
        self._pos = 0
        self._stop = False
        self._cond = threading.Condition()
        self.hinted = 0  # bytes hinted so far (for tests and benches)
        self._thread = threading.Thread(target=self._run, name="shardpoint-ahead", daemon=True)
        self._thread.start()

    def advance(self, nbytes: int) -> None:
        """The iterator has started reading ``nbytes`` more of the spans."""
        with self._cond:
            self._pos += nbytes
            self._cond.notify_all()

    def _run(self) -> None:
        fd, open_file = -1, -1  # the descriptor held and the index of its file
        try:
            for f, off, n in self._pieces:
                with self._cond:
                    while not self._stop and self.hinted > self._pos + self._ahead:
                        self._cond.wait()
                    if self._stop:
                        return
                if f != open_file:
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                    fd = os.open(self._paths[f], os.O_RDONLY | os.O_NONBLOCK)
                    open_file = f
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                # outside the lock: the kernel allocates the pages and queues the reads
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
                self.hinted += n
        except OSError:
            # a file that cannot be opened or a hint the file system refuses: the iterator's
            # own reads go on without hints (and name the file if it is really unreadable)
            return
        finally:
            if fd >= 0:
                os.close(fd)

    def close(self) -> None:
        """Stop hinting (waits for the thread, which closes the file it holds)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
