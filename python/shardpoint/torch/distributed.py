"""Multi-rank saves without DCP: every rank writes the keys it owns, rank 0 commits.

``save_distributed(state, prefix)`` is a collective over a ``torch.distributed`` process group
(any backend; gloo on CPU works). Steps, all of them collectives, so every rank returns or
raises together:

1. each rank flattens its own state and the ranks exchange key lists and structures
   (``all_gather_object``: small JSON-able descriptions, never tensor data); a key owned by two
   ranks raises ``DuplicateKeyError`` on every rank before anything is written;
2. each rank writes its keys into its own shards and partial index (``sp.Writer(rank=r,
   world_size=W)``), in parallel with the others; rank 0 carries the merged metadata;
3. the ranks exchange success flags; if all succeeded rank 0 merges the partial indexes
   (``sp.merge``: no data copied) and commits ``prefix.index`` atomically;
4. the merge outcome is broadcast, so the checkpoint exists when the call returns on any rank.

The result is one ordinary checkpoint: ``shardpoint.torch.load(prefix)`` or ``sp.open(prefix)``
in any single process opens it lazily. A rank that dies mid-save leaves the previous checkpoint
at ``prefix`` intact (its temp files are cleaned up by the next commit at ``prefix``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from .. import storage
from ..errors import CheckpointError, DuplicateKeyError
from .codec import METADATA_KEY
from .tensors import _prepare

__all__ = ["save_distributed"]


def _merge_structures(structures: list[dict[str, Any]]) -> dict[str, Any]:
    """Union of the ranks' nested dict structures (each rank owns whole leaves)."""

    def merge(a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        if "d" not in a or "d" not in b:
            raise DuplicateKeyError(f"state entry {path or '/'} is owned by more than one rank")
        items = {(k, tag): sub for k, tag, sub in a["d"]}
        for k, tag, sub in b["d"]:
            if (k, tag) in items:
                items[(k, tag)] = merge(items[(k, tag)], sub, f"{path}/{k}")
            else:
                items[(k, tag)] = sub
        # the mapping's kind (storage/mapping_kinds.py) as the first rank recorded it
        kind = {k: v for k, v in a.items() if k != "d"} or {k: v for k, v in b.items() if k != "d"}
        return {"d": [[k, tag, sub] for (k, tag), sub in items.items()], **kind}

    merged: dict[str, Any] = {"d": []}
    for s in structures:
        merged = merge(merged, s, "")
    return merged


def _describe(rank: int, exc: BaseException) -> str:
    return f"rank {rank}: {type(exc).__name__}: {exc}"


def save_distributed(
    state: Mapping[str, Any],
    prefix: str | os.PathLike[str],
    process_group: Any = None,
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    shards: int = 1,
    durable: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Save the union of every rank's ``state`` as one checkpoint at ``prefix`` (collective).

    Args:
        state: this rank's (nested) state dict: the keys this rank owns. Ranks may own
            different entries of the same nested dict; a flat key owned twice is an error.
        prefix: checkpoint prefix, the same on every rank (a shared file system).
        process_group: the group to save over (default: the default group).
        compression, level, durable: as :func:`shardpoint.save_file`.
        shards: shard files (and writer threads) per rank.
        metadata: JSON-able mapping stored in the index (rank 0's is used).
    """
    group = process_group
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)

    # 1. describe the local state and exchange the descriptions; a bad value or a key owned
    # twice fails on every rank (collectively) before anything is written
    described: dict[str, Any] | None = None
    local_exc: Exception | None = None
    try:
        payload, meta = _prepare(state)
        described = {"keys": sorted(payload) + sorted(meta["aliases"]), "meta": meta}
        if rank == 0:  # one id for this save: the merge refuses stale partials of another
            described["merge_token"] = secrets.token_hex(8)
    except Exception as exc:  # re-raised below, after telling the other ranks
        local_exc = exc
    gathered: list[Any] = [None] * world
    dist.all_gather_object(
        gathered,
        described if local_exc is None else {"error": _describe(rank, local_exc)},
        group=group,
    )
    errors = [d["error"] for d in gathered if "error" in d]
    if local_exc is not None:
        raise local_exc
    if errors:
        raise CheckpointError(
            f"distributed save of {os.fspath(prefix)} failed: {'; '.join(errors)}"
        )
    owner: dict[str, int] = {}
    for r, desc in enumerate(gathered):
        for key in desc["keys"]:
            if key in owner:
                raise DuplicateKeyError(
                    f"key {key!r} is saved by rank {owner[key]} and rank {r}; each key must be "
                    "owned by exactly one rank"
                )
            owner[key] = r
    merged = {
        "version": gathered[0]["meta"]["version"],
        "structure": _merge_structures([d["meta"]["structure"] for d in gathered]),
        "aliases": {k: v for d in gathered for k, v in d["meta"]["aliases"].items()},
        "groups": [g for d in gathered for g in d["meta"]["groups"]],
    }

    # 2. every rank writes its own shards and partial index
    error: str | None = None
    try:
        parent = os.path.dirname(os.fspath(prefix))
        if parent:
            os.makedirs(parent, exist_ok=True)
        writer = storage.Writer(
            prefix,
            compression=compression,
            level=level,
            shards=shards,
            durable=durable,
            rank=rank,
            world_size=world,
            metadata=dict(metadata or {}) if rank == 0 else None,
            merge_token=gathered[0]["merge_token"],
            _sections={METADATA_KEY: merged} if rank == 0 else None,
        )
        try:
            for key, value in payload.items():
                writer.add(key, value)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
    except Exception as exc:  # reported to every rank below, then re-raised here
        error = _describe(rank, exc)
        local_exc = exc

    # 3. all partial indexes exist (or someone failed): rank 0 merges
    flags: list[Any] = [None] * world
    dist.all_gather_object(flags, error, group=group)
    failures = [f for f in flags if f]
    outcome: list[Any] = [None]
    if not failures and rank == 0:
        try:
            storage.merge(prefix, world, durable=durable, token=gathered[0]["merge_token"])
        except Exception as exc:  # noqa: BLE001 - broadcast, then raised on every rank
            outcome[0] = _describe(0, exc) + " (merge)"
    # 4. everyone learns whether the checkpoint was committed
    dist.broadcast_object_list(
        outcome, src=dist.get_global_rank(group, 0) if group else 0, group=group
    )
    if local_exc is not None:
        raise local_exc
    if failures or outcome[0]:
        raise CheckpointError(
            f"distributed save of {os.fspath(prefix)} failed; the previous checkpoint (if any) "
            "is unchanged: " + "; ".join(failures + ([outcome[0]] if outcome[0] else []))
        )
