"""The consuming thread's intra-op thread count, lowered while it takes values from
``weights_iterator`` and given back exactly afterwards.

Why: a serving engine copies each value into its parameter (``param.data.copy_(w)``) between
two ``next()`` calls. torch runs a large copy on its OpenMP team, and with torch's default
wait policy the team's workers spin between copies, waiting for the next parallel region. On
a host whose cores the load shares, those spinning workers take the CPU the iterator's reader
and decoder threads need: a ``perf record`` of the route put 81 % of the load phase's samples
in libgomp (docs/SERVING.md, "Issue 41"). One intra-op thread in the consuming thread keeps
every copy on that thread (memory-bound: a second thread adds little to it) and leaves the
team asleep, so the reads overlap the copies instead of competing with them.

What must stay true: the count is the consuming thread's own. With OpenMP (torch's CPU
backend) the calling thread's ``omp`` setting is what ``torch.get_num_threads()`` reads and
what decides a parallel region's team, so it is changed through the OpenMP runtime torch loaded
(``omp_set_num_threads``, found in ``/proc/self/maps``), in that thread only:
``torch.set_num_threads`` would also change the process-wide default that threads starting
to use torch meanwhile copy, and those would keep one thread for good. Where no OpenMP runtime
can be found, or setting it does not show in ``torch.get_num_threads()``,
``torch.set_num_threads`` is the fallback. The count is given back in the thread that lowered
it (a restore from another thread waits for the consumer's next call), and it is exactly what
``torch.get_num_threads()`` said before.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

import torch

__all__ = ["ConsumerThreads", "thread_setter"]

_OMP_NAMES = ("libgomp", "libiomp5", "libomp")
_setter: list[Callable[[int], None]] = []


def _omp_runtime() -> str | None:
    """The OpenMP runtime mapped into this process that torch uses: one under torch's own
    directory if there is one (wheels bundle theirs), else the only one mapped."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if ".so" in line}
    except OSError:
        return None
    libs = sorted(p for p in paths if os.path.basename(p).startswith(_OMP_NAMES))
    here = os.path.dirname(os.path.realpath(torch.__file__))
    own = [p for p in libs if os.path.realpath(p).startswith(here + os.sep)]
    if own:
        return own[0]
    return libs[0] if len(libs) == 1 else None


def _omp_setter() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of torch's OpenMP runtime, checked to be what
    ``torch.get_num_threads()`` reads; None where there is no such runtime."""
    path = _omp_runtime()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).omp_set_num_threads  # the mapped copy: dlopen finds it loaded
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = None

    def set_threads(n: int) -> None:
        fn(n)

    before = torch.get_num_threads()  # torch's per-thread first-use setup runs before ours
    probe = 2 if before == 1 else 1
    set_threads(probe)
    seen = torch.get_num_threads()
    set_threads(before)
    return set_threads if seen == probe and torch.get_num_threads() == before else None


def thread_setter() -> Callable[[int], None]:
    """A function setting the calling thread's intra-op thread count: the OpenMP runtime's
    per-thread setter where it is found and works, else ``torch.set_num_threads``."""
    if not _setter:
        _setter.append(_omp_setter() or torch.set_num_threads)
    return _setter[0]


class ConsumerThreads:
    """Lowers the calling thread's intra-op thread count once, restores it once."""

    def __init__(self) -> None:
        # (thread ident, count before) while lowered; None before and after
        self._saved: tuple[int, int] | None = None
        self._done = False

    def lower(self, limit: int) -> None:
        """Set at most ``limit`` intra-op threads in the calling thread, the first time only
        (a count already at or below ``limit`` is left alone)."""
        if self._done or self._saved is not None:
            return
        self._done = True
        before = torch.get_num_threads()
        if before > limit:
            setter = thread_setter()
            self._saved = (threading.get_ident(), before)
            setter(limit)

    def restore(self) -> None:
        """Give the lowering thread its count back (a no-op in any other thread, or when
        nothing was lowered)."""
        saved = self._saved
        if saved is None or saved[0] != threading.get_ident():
            return
        self._saved = None
        thread_setter()(saved[1])

    @property
    def lowered(self) -> bool:
        """Whether a count is lowered now (and not yet given back)."""
        return self._saved is not None
