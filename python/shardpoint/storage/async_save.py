"""Asynchronous saves: snapshot into reusable host memory, write and commit in the background.

A save with ``blocking=False`` does, in the caller's thread, only what must happen before the
caller may touch its state again: it validates the arguments, encodes the values and copies
every array into *staging buffers* (host memory owned by an :class:`AsyncSaver` and reused from
one save to the next), in parallel with the GIL released. It then returns a :class:`SaveFuture`;
one background thread per saver compresses, writes and commits the staged copy.

Rules (docs/ARCHITECTURE.md "Asynchronous saves"):

- snapshot: when the call returns, the checkpoint's contents are fixed; the caller may modify
  every array in place;
- order: a saver commits its saves in call order (one writer thread, FIFO);
- bounded memory: at most ``max_in_flight`` saves (default 1) are staged or being written per
  saver; a further save waits in its call until the oldest one is done, and re-uses that
  save's staging buffers (no new allocation once warm when the values keep their sizes);
- errors are never lost: a failed save raises on its future's ``result()``/``exception()``,
  and, if nobody looked there, on the saver's next save and on :meth:`AsyncSaver.wait`;
- exit: the interpreter waits (``atexit``) for every saver's queued and running saves, so a
  script that ends right after ``save(..., blocking=False)`` still leaves its checkpoint.
  A process killed (SIGKILL) during a background write leaves the previous checkpoint intact:
  the commit protocol (FORMAT.md §8) only ever renames a complete index into place.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError

__all__ = ["AsyncSaver", "SaveFuture", "StagingBuffers", "default_saver", "wait_all"]

T = TypeVar("T")

#: An encoded item as ``values.encode`` returns it: key, dtype, kind, shape, uint8 bytes.
Item = tuple[str, str, str, tuple[int, ...], np.ndarray]


class SaveFuture(Future[Any]):
    """The future of one asynchronous save: a ``concurrent.futures.Future`` whose result is
    what the blocking call returns. Looking at its exception (``result()`` raising, or
    ``exception()``) counts as observing a failure, so the saver does not raise it again."""

    def __init__(self) -> None:
        super().__init__()
        self.observed = False

    @classmethod
    def completed(cls, value: Any) -> SaveFuture:
        """A future that already holds ``value`` (an asynchronous save that had nothing to do)."""
        f = cls()
        f.set_result(value)
        return f

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(timeout)
        except BaseException:
            if self.done():
                self.observed = True
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        e = super().exception(timeout)
        if e is not None:
            self.observed = True
        return e


class StagingBuffers:
    """Host buffers that receive the snapshot of one save, reused by the next save that has
    values of the same keys and sizes. ``allocations`` counts buffers ever allocated (tests
    use it to check that a warm saver allocates nothing)."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}
        self.allocations = 0

    def _buffer(self, key: str, nbytes: int) -> np.ndarray:
        b = self._bufs.get(key)
        if b is None or b.nbytes != nbytes:
            b = np.empty(nbytes, dtype=np.uint8)
            self._bufs[key] = b
            self.allocations += 1
        return b

    def stage(self, items: list[Item], *, with_crc: bool) -> tuple[list[Item], list[int] | None]:
        """Copy the bytes of ``items`` into this set's buffers (parallel, GIL released) and
        return the items pointing at the copies, plus each item's crc32c when asked."""
        keys = {it[0] for it in items}
        for k in [k for k in self._bufs if k not in keys]:
            del self._bufs[k]  # values no longer saved: do not keep their memory
        dsts = [self._buffer(it[0], it[4].nbytes) for it in items]
        crcs = _core.stage_copy([it[4] for it in items], dsts, with_crc)
        staged = [
            (k, d, kind, shape, dst)
            for (k, d, kind, shape, _), dst in zip(items, dsts, strict=True)
        ]
        return staged, (crcs if with_crc else None)

    @property
    def nbytes(self) -> int:
        """Bytes of host memory held."""
        return sum(b.nbytes for b in self._bufs.values())


@dataclass
class _Job:
    write: Callable[[], Any]
    future: SaveFuture
    buffers: Any
    release: Callable[[Any], None] = field(repr=False)


class AsyncSaver:
    """Runs saves in one background thread, in call order, each from its own snapshot.

    Args:
        max_in_flight: saves staged or being written at once (each holds one set of staging
            buffers: that is the memory bound). A save beyond it waits, in its call, for the
            oldest to finish.
        name: shown in the worker thread's name and in messages.
    """

    def __init__(self, max_in_flight: int = 1, name: str = "shardpoint-saver") -> None:
        if int(max_in_flight) < 1:
            raise InvalidArgumentError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = int(max_in_flight)
        self.name = name
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._busy = 0  # jobs submitted and not finished
        self._free: list[Any] = []  # idle buffer sets
        self._sets = 0  # buffer sets created
        self._failed: SaveFuture | None = None
        self._thread: threading.Thread | None = None
        _SAVERS.add(self)

    # -- submitting ------------------------------------------------------------------------

    def submit(
        self,
        stage: Callable[[Any], Callable[[], T]],
        *,
        new_buffers: Callable[[], Any] = StagingBuffers,
    ) -> SaveFuture:
        """Run ``stage(buffers)`` now, in the caller's thread (it must copy everything the
        save needs into ``buffers`` and return the function that writes it), then run that
        function in the background. Returns its future. Raises an earlier save's unobserved
        error instead of starting a new one."""
        self.check()
        bufs = self._acquire(new_buffers)
        try:
            write = stage(bufs)
        except BaseException:
            self._release(bufs)
            raise
        fut = SaveFuture()
        with self._cond:
            self._queue.append(_Job(write, fut, bufs, self._release))
            self._start_worker()
            self._cond.notify_all()
        return fut

    def _acquire(self, new_buffers: Callable[[], Any]) -> Any:
        with self._cond:
            while not self._free and self._sets >= self.max_in_flight:
                self._cond.wait()
            self._busy += 1
            if self._free:
                return self._free.pop()
            self._sets += 1
        try:
            return new_buffers()
        except BaseException:
            with self._cond:
                self._sets -= 1
                self._busy -= 1
                self._cond.notify_all()
            raise

    def _release(self, bufs: Any) -> None:
        with self._cond:
            self._free.append(bufs)
            self._busy -= 1
            self._cond.notify_all()

    def _start_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    # -- the background thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if not self._cond.wait(timeout=30.0) and not self._queue:
                        self._thread = None  # idle: let the thread end; the next save starts one
                        return
                job = self._queue.popleft()
            self._execute(job)

    def _execute(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            job.release(job.buffers)
            return
        try:
            result = job.write()
        except BaseException as e:
            with self._cond:
                if self._failed is None or self._failed.observed:
                    self._failed = job.future
            # Buffers go back before the future completes, so a caller that waits on this
            # future and saves again finds them free.
            job.release(job.buffers)
            job.future.set_exception(e)
        else:
            job.release(job.buffers)
            job.future.set_result(result)

    # -- waiting and errors ----------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Saves submitted and not finished."""
        with self._cond:
            return self._busy

    def check(self) -> None:
        """Raise the error of an earlier failed save nobody has observed yet (once)."""
        with self._cond:
            f, self._failed = self._failed, None
        if f is not None and not f.observed:
            f.observed = True
            e = f.exception()
            assert e is not None
            raise e

    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted save has finished, then raise the first unobserved
        error, if any. ``TimeoutError`` if saves are still running after ``timeout`` s."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._busy == 0, timeout):
                raise TimeoutError(
                    f"{self.name}: {self._busy} save(s) still in flight after {timeout} s"
                )
        self.check()

    def _reset_after_fork(self) -> None:
        # The child has none of the parent's threads: drop queued work (it belongs to the
        # parent) and start over.
        self._cond = threading.Condition()
        self._queue.clear()
        self._busy = 0
        self._sets = len(self._free)  # buffer sets held by the parent's jobs are not ours
        self._failed = None
        self._thread = None


_SAVERS: weakref.WeakSet[AsyncSaver] = weakref.WeakSet()
_DEFAULT: AsyncSaver | None = None
_DEFAULT_LOCK = threading.Lock()


def default_saver() -> AsyncSaver:
    """The process-wide saver used by ``save_file(..., blocking=False)``."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = AsyncSaver(name="shardpoint-save_file")
        return _DEFAULT


def wait_all(timeout: float | None = None) -> None:
    """Wait for the saves of every saver in this process; raise the first unobserved error."""
    for s in list(_SAVERS):
        s.wait(timeout)


def _wait_at_exit() -> None:
    for s in list(_SAVERS):
        try:
            s.wait()
        except BaseException as e:  # nobody is left to raise it to: say it
            print(f"shardpoint: asynchronous save failed: {e!r}", file=sys.stderr)


def _after_fork() -> None:
    global _DEFAULT_LOCK
    _DEFAULT_LOCK = threading.Lock()  # another thread may have held it at the fork
    for s in list(_SAVERS):
        s._reset_after_fork()


atexit.register(_wait_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
