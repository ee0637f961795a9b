"""Where the object graph's start-of-job reads (the state file, a directory listing) may be
done once for many processes (docs/SCALE.md, issue 42).

At thousands of ranks, each rank reading the state file and listing the directory when it
builds a ``CheckpointManager`` or calls ``latest_checkpoint`` is thousands of GETs and LISTs
against one prefix at the same moment. A *runner* installed here runs such a read on one
process and hands its result to all: ``shardpoint.torch.share_listings(group)`` installs one
that broadcasts over a ``torch.distributed`` group. This package never imports torch: the
runner is whatever was installed, and without one every read is done where it is asked.

Only reads every process makes at the same point go through the runner (a runner is a
collective: a process that calls it alone would wait for the others forever): the state read
of ``latest_checkpoint`` and of ``CheckpointManager.__init__``, and the candidates of
``restore_or_initialize``. The listings inside ``save`` (the orphan sweep) are made by the
process that saves, which is often one rank only, so they never go through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Runner", "install", "installed", "run_shared"]

T = TypeVar("T")

#: runs a read on one process and returns its result on every process of the group
Runner = Callable[[Callable[[], Any]], Any]

_runner: list[Runner | None] = [None]


def install(runner: Runner | None) -> Runner | None:
    """Install ``runner`` (None: every read is done locally again); returns the previous one."""
    previous = _runner[0]
    _runner[0] = runner
    return previous


def installed() -> Runner | None:
    """The runner in use (None: reads are local)."""
    return _runner[0]


def run_shared(read: Callable[[], T]) -> T:
    """``read()`` done once for the group through the installed runner, or here without one.
    The result must pickle when a runner is installed."""
    runner = _runner[0]
    if runner is None:
        return read()
    result: T = runner(read)
    return result
