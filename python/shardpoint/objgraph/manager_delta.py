"""Delta checkpoints under a :class:`~shardpoint.objgraph.manager.CheckpointManager`
(``delta=True, full_every=K``, docs/DELTA.md): the retention rule that never deletes a base a
kept checkpoint still needs.

A delta checkpoint is unreadable without its base chain (FORMAT.md §11), so the checkpoints
that retention would delete are filtered here: one needed (directly or down a chain) by a
checkpoint still listed stays listed (the listed set may then exceed ``max_to_keep`` until the
next full save ends the chain); one needed only by a checkpoint that stays on disk unlisted
(``keep_checkpoint_every_n_hours``) stays on disk unlisted with it.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable

from ..delta.tools import needed_bases  # not the package: its sync module names torch
from ..errors import CheckpointError

__all__ = ["check_options", "max_chain", "protect_bases"]

logger = logging.getLogger("shardpoint.objgraph")


def check_options(
    full_every: int | None, remote: bool, incremental: bool, digest: object, hashed: bool = False
) -> int:
    """The ``full_every`` of a delta manager, checked (default 8)."""
    k = 8 if full_every is None else full_every
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"full_every must be a positive integer, got {full_every!r}")
    if remote or incremental or digest or hashed:
        raise ValueError(
            "delta=True saves local checkpoints against a local base: not with an object-store "
            "URL, incremental=True, digest= or hashed_prefixes=True"
        )
    return k


def max_chain(full_every: int) -> int:
    """The chain bound that makes every ``full_every``-th save a full one (depth 0, 1, …,
    ``full_every - 1``, then 0 again)."""
    return full_every - 1


def _needs(path: str) -> list[str]:
    """The bases ``path`` needs (``[]`` when it is gone or unreadable: nothing to protect)."""
    try:
        return needed_bases(path)
    except (CheckpointError, OSError) as e:
        logger.warning("%s: could not read its delta table (%s); it protects no base", path, e)
        return []


def protect_bases(
    doomed: list[str],
    kept: OrderedDict[str, float],
    on_disk: Callable[[], list[str]],
    stamps: dict[str, float],
) -> list[str]:
    """The checkpoints of ``doomed`` that may really be deleted. Those a listed checkpoint of
    ``kept`` needs are put back into ``kept`` (in place, oldest first, with their ``stamps``);
    those needed only by a checkpoint staying on disk (``on_disk()``: every checkpoint of the
    manager's prefix that has an index) are left on disk unlisted."""
    if not doomed:
        return doomed
    key = os.path.abspath
    gone = {key(p) for p in doomed}
    listed: set[str] = set()
    for p in kept:
        listed.update(_needs(p))
    relisted = [p for p in doomed if key(p) in listed]
    others: set[str] = set()
    if len(relisted) < len(doomed):
        for p in on_disk():
            if key(p) not in gone and p not in kept:
                others.update(_needs(p))
    if relisted:
        rest = list(kept.items())
        kept.clear()
        for p in relisted:
            kept[p] = stamps[p]
        kept.update(rest)
    return [p for p in doomed if key(p) not in listed and key(p) not in others]
