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
the collective lives here: ``sptorch.on_one_rank(lambda: manager.restore_candidates())``-style
wrapping of any listing call, and the two common ones ready-made.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from .. import storage
from ..errors import CheckpointError
from ..objgraph import checkpoint_state

__all__ = ["on_one_rank", "latest_checkpoint", "gc"]

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
