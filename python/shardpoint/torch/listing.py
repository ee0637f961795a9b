"""Listings and state reads done by one rank, the answer broadcast (docs/SCALE.md, issue 42).

A save never lists (docs/OBJECT_STORE.md); what does is ``gc``, the manager's restore
candidates and orphan sweep, and ``latest_checkpoint`` reads the state object. In a job of
thousands of ranks, each doing it at once is thousands of LISTs or GETs against one prefix:
S3 answers 503 SlowDown above ~5,500 reads/s per prefix, and a swallowed 503 has been read as
"no checkpoint" and restarted a job from scratch (dlio_benchmark #347). These helpers run the
call on one rank and broadcast its result (or its error) over the job's ``torch.distributed``
group, so every rank gets the same answer from one request. They are collectives: every rank
of the group must call them. Without an initialized process group they just run the call.

The object graph (``sp.CheckpointManager``, ``sp.latest_checkpoint``) never imports torch, so
the collective lives here: ``sptorch.on_one_rank(fn)`` wraps any listing call, two common ones
are ready-made, and :func:`share_listings` routes the object graph's own start-of-job reads
(``sp.latest_checkpoint``, the state read of ``sp.CheckpointManager(...)`` and the candidates of
``restore_or_initialize``) through it (objgraph/shared_reads.py). That routing is asked for,
not automatic when a process group exists: it makes those calls collectives, and code that
builds a manager on rank 0 only would then wait forever for the other ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from .. import storage
from ..errors import CheckpointError
from ..objgraph import checkpoint_state, shared_reads

__all__ = ["on_one_rank", "latest_checkpoint", "gc", "share_listings", "SharedListings"]

T = TypeVar("T")


def on_one_rank(fn: Callable[[], T], *, group: Any = None, src: int = 0) -> T:
    """Run ``fn()`` on rank ``src`` of ``group`` (default: the default group) and return its
    result on every rank (a collective; the result must pickle). An exception on ``src`` is
    raised on every rank as ``CheckpointError`` naming it (the original on ``src`` itself)."""
    if not (dist.is_available() and dist.is_initialized()):
        return fn()
    rank = dist.get_rank(group)
    box: list[Any] = [None]
    error: BaseException | None = None
    if rank == src:
        try:
            box[0] = ("ok", fn())
        except Exception as exc:  # noqa: BLE001 - told to every rank, re-raised below
            error = exc
            box[0] = ("error", f"{type(exc).__name__}: {exc}")
    dist.broadcast_object_list(
        box, src=dist.get_global_rank(group, src) if group is not None else src, group=group
    )
    if error is not None:
        raise error
    kind, value = box[0]
    if kind == "error":
        raise CheckpointError(f"rank {src} failed: {value}")
    return value


def latest_checkpoint(
    checkpoint_dir: str | os.PathLike[str], *, group: Any = None, src: int = 0
) -> str | None:
    """``sp.latest_checkpoint(checkpoint_dir)`` read by one rank, the same answer on all."""
    return on_one_rank(
        lambda: checkpoint_state.latest_checkpoint(checkpoint_dir), group=group, src=src
    )


def gc(
    url: str,
    *,
    older_than: float = 3600.0,
    storage_options: Any = None,
    group: Any = None,
    src: int = 0,
) -> int:
    """``sp.storage.gc`` (one listing of ``url``) on one rank; its count on all."""
    return on_one_rank(
        lambda: storage.gc(url, older_than=older_than, storage_options=storage_options),
        group=group,
        src=src,
    )


class SharedListings:
    """What :func:`share_listings` installed; ``close()`` (or leaving the ``with`` block)
    puts back the previous behaviour."""

    def __init__(self, group: Any, src: int) -> None:
        self._previous = shared_reads.install(lambda read: on_one_rank(read, group=group, src=src))
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            shared_reads.install(self._previous)
            self._closed = True

    def __enter__(self) -> SharedListings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def share_listings(*, group: Any = None, src: int = 0) -> SharedListings:
    """From now on (or inside ``with``), ``sp.latest_checkpoint``, ``sp.CheckpointManager``'s
    state read and ``restore_or_initialize``'s listing are done by rank ``src`` of ``group``
    and broadcast: one request for the job instead of one per rank. Those calls become
    collectives: every rank of the group must make them, in the same order (a manager built
    on one rank only must not be built while this is on). Without an initialized process
    group the reads are local, as before."""
    return SharedListings(group, src)
