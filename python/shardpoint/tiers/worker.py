"""One background thread per tier that runs its jobs in call order.

Every rank submits the same jobs in the same order, and each job issues its collectives on the
tier's own group, so the ranks' collectives pair up. A job's error is kept on its future and
raised again by the next :meth:`OrderedWorker.check` (the next save), unless someone looked at
the future first: a failed save is never silent.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

from ..storage.async_save import SaveFuture

__all__ = ["OrderedWorker"]


class OrderedWorker:
    """A daemon thread running submitted callables one at a time, in order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], SaveFuture] | None] = queue.Queue()
        self._pending: list[SaveFuture] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                fut.set_exception(e)

    def submit(self, fn: Callable[[], Any]) -> SaveFuture:
        fut = SaveFuture()
        with self._lock:
            self._pending = [f for f in self._pending if not f.done() or _unseen_error(f)]
            self._pending.append(fut)
        self._queue.put((fn, fut))
        return fut

    def check(self) -> None:
        """Raise the first error of a finished job that nobody has looked at."""
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            if f.done() and _unseen_error(f):
                f.result()

    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted job is done; raise the first unseen error."""
        with self._lock:
            pending = list(self._pending)
        futures.wait(pending, timeout)
        self.check()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _unseen_error(f: SaveFuture) -> bool:
    return f.done() and not f.observed and super(SaveFuture, f).exception() is not None
