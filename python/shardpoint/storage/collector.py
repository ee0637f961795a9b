"""Python's cyclic garbage collector paused while shardpoint builds a large structure it keeps
(a safetensors header's records, an index's metadata, a load plan, a batch of tensors waiting
for the consumer): one object or more per tensor, none of them garbage.

Why: each allocation counts towards a collection, and every tenth young collection may become
a full one, which walks every object of the process: with torch imported about 190,000 of
them, ~0.1 s each on this project's VM. For a 20,000-tensor checkpoint, opening it took 85
young collections, planning its load 54-167 more and making its tensors 125-180, and the
weights iterator spent half its time in full collections (docs/SERVING.md, "Issue 41
(twenty-fourth round)"). Paused, the objects are built at once; the collector counts them from
where it resumes. Mercurial pauses its collector around building large containers for the
same reason.

What must stay true: only around work of bounded size that creates no cyclic garbage (never
around I/O: other threads keep allocating); the collector's state is restored exactly. Pauses
may overlap (the weights iterator's thread and the caller's): the first one in pauses, the
last one out resumes, and only if the collector was running when the first came in (an
application that paused it itself keeps it paused). A process forked while another thread's
pause is under way (a data loader's workers) starts with the collector as it was before that
pause: the thread that would have resumed it does not exist in the child.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]

_lock = threading.Lock()
_inside = 0  # pauses under way, in any thread
_resume = False  # whether the last one out resumes the collector


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's automatic garbage collection for the ``with`` block, resuming it after
    (whatever the block raised) unless it was paused already, or another pause is still under
    way."""
    global _inside, _resume
    with _lock:
        if not _inside:
            _resume = gc.isenabled()
            gc.disable()
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if not _inside and _resume:
                gc.enable()


def _after_fork_in_child() -> None:
    """In a forked child, no pause is under way (the threads that held them were not
    copied): a fresh lock, and the collector resumed if a pause had stopped it."""
    global _lock, _inside, _resume
    _lock = threading.Lock()
    if _inside and _resume:
        gc.enable()
    _inside, _resume = 0, False


os.register_at_fork(after_in_child=_after_fork_in_child)
