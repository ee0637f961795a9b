"""A ``torch.distributed.checkpoint`` save planner whose coordinator step is O(N) and which
reuses the global plan while the layout does not change (docs/SCALE.md, issue 42).

DCP's ``DefaultSavePlanner.create_global_plan`` runs on the coordinator over every rank's
plan: it deduplicates replicated items, builds the ``Metadata`` and rewrites every item's
index hint (a ``dataclasses.replace`` per item), then validates the chunks. At thousands of
ranks that is the save's slowest step (pytorch #163548, #147343; docs/SCALE.md has the
figures). :class:`SavePlanner` is a ``DefaultSavePlanner`` with:

- an O(N) global step with a small constant: one pass over the items builds the metadata and
  finds the non-shard items several ranks plan (each is kept on the rank with the fewest items,
  where DCP balances planned bytes; replicated shards go through DCP's own deduplication),
  index hints are not rewritten (they are
  optional: ``MetadataIndex.index`` takes no part in equality or hashing, and DCP's readers
  search when a hint is absent), and the chunk validation (bounds, overlaps, coverage) is
  vectorized with numpy, falling back to DCP's own validation for a tensor whose chunks do
  not line up along one dimension;
- a plan cache, as DCP's ``enable_plan_caching``: each rank keeps a digest of its last local
  plan and sends an empty, unusable plan when the digest is unchanged; the coordinator keeps
  the last local plans, global plans and ``Metadata`` and, when no rank changed, returns the
  cached ``Metadata`` object and empty plans (O(N) to check, nothing rebuilt, a few bytes per
  rank on the wire). A rank whose plan changed is replanned with the cached plans of the
  others. Resharding is kept: nothing here depends on the number of ranks staying the same
  (a different N is a cache miss).

Use it with shardpoint's StorageWriter: ``dcp.save(sd, storage_writer=StorageWriter(p),
planner=SavePlanner())``. Unlike DCP's cached plans, a cached plan here still carries the
storage data the StorageWriter attaches to this save (its merge token), so the writer can
refuse a stale partial index of a crashed save.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import numpy as np
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint.default_planner import (
    DefaultSavePlanner,
    _validate_global_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

from ..errors import CheckpointError
from .dcp_metadata import chunk_rows, remember_rows

__all__ = ["SavePlanner", "plan_digest"]


def plan_digest(plan: SavePlan) -> str:
    """A digest of what a local save plan asks for: every item's key, type, chunk and tensor
    properties, and the planner data (the flattening mappings). Equal digests: equal layouts."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(plan.items).encode())
    if plan.planner_data is not None:
        h.update(repr(sorted(plan.planner_data.items(), key=lambda kv: str(kv[0]))).encode())
    return h.hexdigest()


@dataclasses.dataclass
class _GlobalCache:
    """The coordinator's last successful global step."""

    local_plans: list[SavePlan]
    global_plans: list[SavePlan]
    metadata: Metadata


# Per cache key (one per planner class or ``cache_key``): like DCP's class-level caches, they
# live as long as the process, so a planner created per save still finds the last save's plans.
_LOCAL: dict[str, tuple[str, SavePlan]] = {}  # rank side: (digest, local plan)
_FINAL: dict[str, SavePlan] = {}  # rank side: the last final plan
_GLOBAL: dict[str, _GlobalCache] = {}  # coordinator side


class SavePlanner(DefaultSavePlanner):
    """DCP ``DefaultSavePlanner`` with an O(N) global step and a plan cache (module
    docstring). ``cache_plans=False`` replans every save; ``cache_key`` separates the caches
    of two kinds of saves made by one process (say, model and optimizer in separate calls)."""

    def __init__(
        self,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        dedup_save_to_lowest_rank: bool = False,
        *,
        cache_plans: bool = True,
        cache_key: str | None = None,
    ) -> None:
        super().__init__(
            flatten_state_dict=flatten_state_dict,
            flatten_sharded_tensors=flatten_sharded_tensors,
            dedup_save_to_lowest_rank=dedup_save_to_lowest_rank,
            enable_plan_caching=False,  # DCP's own cache is replaced by ours
        )
        self._cache_plans = bool(cache_plans)
        self._key = cache_key or f"{type(self).__module__}.{type(self).__qualname__}"
        self._pending: tuple[str, SavePlan] | None = None
        #: whether the last create_local_plan found this rank's layout unchanged (sent an
        #: empty plan), and whether the last create_global_plan reused the cached global plan
        self.local_plan_reused = False
        self.global_plan_reused = False

    # -- rank side ------------------------------------------------------------------------------
    def create_local_plan(self) -> SavePlan:
        plan = create_default_local_save_plan(self.state_dict, self.is_coordinator)
        if self.flatten_state_dict:
            plan = dataclasses.replace(plan, planner_data=self.mappings)
        self.plan = plan
        if not self._cache_plans:
            return plan
        digest = plan_digest(plan)
        cached = _LOCAL.get(self._key)
        self.local_plan_reused = cached is not None and cached[0] == digest and self._key in _FINAL
        if self.local_plan_reused:
            return SavePlan([], usable=False)
        # promoted to the cache in finish_plan, once the global step succeeded
        self._pending = (digest, plan)
        return plan

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        plan = new_plan
        if self._cache_plans:
            if not new_plan.usable:
                cached = _FINAL.get(self._key)
                if cached is None:
                    raise CheckpointError(
                        "the coordinator reused a cached save plan this rank does not have "
                        "(were the planner caches cleared on some ranks only?)"
                    )
                # this save's storage data (the StorageWriter's merge token), the cached items
                plan = dataclasses.replace(cached, storage_data=new_plan.storage_data, usable=True)
            _FINAL[self._key] = plan
            if self._pending is not None:
                _LOCAL[self._key] = self._pending
                self._pending = None
        self.plan = plan
        return plan

    # -- coordinator side ---------------------------------------------------------------------
    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        n = len(all_plans)
        cache = _GLOBAL.get(self._key) if self._cache_plans else None
        if cache is not None and len(cache.local_plans) != n:
            cache = None  # another world size: resharded, plan from scratch
        unchanged = [not p.usable for p in all_plans]
        if any(unchanged) and cache is None:
            raise CheckpointError(
                "ranks reused cached save plans but the coordinator has none for "
                f"{n} ranks (were the planner caches cleared on the coordinator only?)"
            )
        self.global_plan_reused = cache is not None and all(unchanged)
        if cache is not None and all(unchanged):
            self.global_plan, self.metadata = cache.global_plans, cache.metadata
            return [SavePlan([], usable=False)] * n, cache.metadata
        local = [
            cache.local_plans[i] if (cache is not None and unchanged[i]) else p
            for i, p in enumerate(all_plans)
        ]
        global_plans, metadata = self._global_plan(local)
        if cache is not None:
            delta = [
                SavePlan([], usable=False) if _same_items(g, c) else g
                for g, c in zip(global_plans, cache.global_plans, strict=True)
            ]
        else:
            delta = global_plans
        if self._cache_plans:
            _GLOBAL[self._key] = _GlobalCache(local, global_plans, metadata)
        self.global_plan, self.metadata = global_plans, metadata
        return delta, metadata

    def _global_plan(self, plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        """Build the ``Metadata`` (finding duplicates on the way), deduplicate, validate:
        O(total items), one pass over the items plus vectorized checks per tensor."""
        md, dups, rows = _build(plans)
        errors, replicated_shards = _validate(md, len(plans), rows)
        if replicated_shards:
            # the same shard on several ranks (replicated DTensor placements): DCP's own rule
            plans = [
                p if len(p.items) == len(d.items) else d
                for p, d in zip(
                    plans, dedup_save_plans(plans, self.dedup_save_to_lowest_rank), strict=True
                )
            ]
            md, dups, rows = _build(plans)
            errors, _ = _validate(md, len(plans), rows)
        if dups:
            plans = _drop_duplicates(plans, dups, self.dedup_save_to_lowest_rank)
        if errors:
            summary = "; ".join(errors)
            raise ValueError(f"Failed to validate global plan: {summary[:500]}")
        metadata = Metadata(state_dict_metadata=md)
        if self.flatten_state_dict:
            merged: dict[str, Any] = {}
            for plan in reversed(plans):  # the first plan's mapping wins, as DCP's ChainMap
                merged.update(plan.planner_data or {})
            metadata = dataclasses.replace(metadata, planner_data=merged)
        return plans, metadata


def _same_items(a: SavePlan, b: SavePlan) -> bool:
    """Whether two global plans of one rank write the same items (cheap when unchanged: the
    same plan object, or lists of the same item objects)."""
    if a is b or a.items is b.items:
        return True
    if len(a.items) != len(b.items):
        return False
    return all(x is y or x == y for x, y in zip(a.items, b.items, strict=True))


def _build(
    plans: list[SavePlan],
) -> tuple[dict[str, Any], dict[str, list[int]], dict[int, tuple[list[Any], np.ndarray]]]:
    """The ``state_dict_metadata`` of ``plans``, the non-shard items several ranks plan (a
    plain tensor or object every rank holds): ``{fqn: [ranks]}``, and the shards' chunk rows
    (:func:`_shard_rows`). Shards are appended in rank order, as DCP's
    ``create_default_global_save_plan`` does."""
    shard, byte_io = WriteItemType.SHARD, WriteItemType.BYTE_IO
    md: dict[str, Any] = {}
    # shard key -> (its chunk list, its tensor number, the chunks and tensor numbers of
    # every shard of its rank of tensor, in the order the items come: rank after rank)
    slots: dict[str, tuple[list[Any], int, list[Any], list[int]]] = {}
    by_dims: dict[int, tuple[list[Any], list[int]]] = {}
    holder: dict[str, int] = {}  # non-shard key -> the first rank planning it
    dups: dict[str, list[int]] = {}
    for r, plan in enumerate(plans):
        for item in plan.items:
            fqn = item.index.fqn
            kind = item.type
            td = item.tensor_data
            if kind is shard:
                if td is None:
                    raise ValueError(f"shard item {fqn!r} has no tensor data")
                slot = slots.get(fqn)
                if slot is None:
                    if fqn in md:
                        raise ValueError(f"key {fqn!r} is planned both whole and as shards")
                    entry = md[fqn] = TensorStorageMetadata(td.properties, td.size, [])
                    flat, tids = by_dims.setdefault(len(td.size), ([], []))
                    slot = slots[fqn] = (entry.chunks, len(slots), flat, tids)
                chunk = td.chunk
                slot[0].append(chunk)
                slot[2].append(chunk)
                slot[3].append(slot[1])
                continue
            first = holder.get(fqn)
            if first is not None:
                dups.setdefault(fqn, [first]).append(r)
                continue
            if fqn in md:
                raise ValueError(f"key {fqn!r} is planned both whole and as shards")
            holder[fqn] = r
            if kind is byte_io:
                md[fqn] = BytesStorageMetadata()
            elif td is None:
                raise ValueError(f"tensor item {fqn!r} has no tensor data")
            else:
                md[fqn] = TensorStorageMetadata(td.properties, td.size, [td.chunk])
    return md, dups, _shard_rows(slots, by_dims)


def _shard_rows(
    slots: dict[str, tuple[list[Any], int, list[Any], list[int]]],
    by_dims: dict[int, tuple[list[Any], list[int]]],
) -> dict[int, tuple[list[Any], np.ndarray]]:
    """The chunk rows (``chunk_rows``) of every sharded tensor, ``{id(chunks): (chunks,
    rows)}``: flattened in the order the items came (rank after rank: the order they sit in
    memory; tensor by tensor the same walk jumps between ranks' objects and takes 8x longer
    at 4,096 ranks), then split by tensor with one stable sort. A rank-of-tensor group with
    a chunk of another rank is left out (``_validate`` then reports its tensor)."""
    lists = [(chunks, tid) for chunks, tid, _, _ in slots.values()]
    out: dict[int, tuple[list[Any], np.ndarray]] = {}
    for dims, (flat, tids) in by_dims.items():
        if not dims:
            continue
        rows = chunk_rows(flat, dims)
        if rows is None:
            continue
        tid = np.array(tids, dtype=np.int64)
        order = np.argsort(tid, kind="stable")
        ordered = rows[order]
        ids, starts = np.unique(tid[order], return_index=True)
        ends = np.append(starts[1:], len(order))
        for t, a, b in zip(ids.tolist(), starts.tolist(), ends.tolist(), strict=True):
            chunks = lists[t][0]
            out[id(chunks)] = (chunks, ordered[a:b])
    return out


def _drop_duplicates(
    plans: list[SavePlan], dups: dict[str, list[int]], to_lowest_rank: bool
) -> list[SavePlan]:
    """Keep each duplicated non-shard item on one of the ranks planning it: the lowest with
    ``to_lowest_rank``, else the one with the fewest items left (ties: the lowest), so the
    writes spread as DCP's rule spreads them (it balances planned bytes; counting items
    needs no size per item). Plans that lose nothing are returned as they are."""
    counts = [len(p.items) for p in plans]
    drop: dict[int, set[str]] = {}
    for fqn, ranks in dups.items():
        keep = min(ranks) if to_lowest_rank else min(ranks, key=lambda r: (counts[r], r))
        for r in ranks:
            if r != keep:
                drop.setdefault(r, set()).add(fqn)
                counts[r] -= 1
    out = list(plans)
    shard = WriteItemType.SHARD
    for r, names in drop.items():
        items = [i for i in plans[r].items if i.type is shard or i.index.fqn not in names]
        out[r] = dataclasses.replace(plans[r], items=items)
    return out


def _validate(
    md: dict[str, Any], n_plans: int, rows: dict[int, tuple[list[Any], np.ndarray]]
) -> tuple[list[str], bool]:
    """DCP's global-plan checks (chunks in bounds, not overlapping, covering the tensor when
    several ranks save), vectorized per tensor; a tensor whose chunks are not disjoint along
    its longest dimension after sorting is checked by DCP's own validation instead. Also
    returns whether some tensor has the same chunk twice (a replicated shard: deduplicate).
    ``rows``: chunk rows already flattened (``_build``), by chunk list."""
    errors: list[str] = []
    replicated = False
    memo: dict[int, tuple[list[Any], np.ndarray]] = {}
    for key, value in md.items():
        if not isinstance(value, TensorStorageMetadata) or len(value.size) == 0:
            continue
        chunks = value.chunks
        dims = len(value.size)
        known = rows.get(id(chunks))
        boxes = known[1] if known is not None else chunk_rows(chunks, dims)
        if boxes is None:
            errors.append(f"key:{key} has a chunk of another rank than its tensor")
            continue
        memo[id(chunks)] = (chunks, boxes)
        offsets, sizes = boxes[:, :dims], boxes[:, dims:]
        size = np.array(value.size, dtype=np.int64)
        if (offsets < 0).any() or (sizes < 0).any() or (offsets + sizes > size).any():
            errors.append(f"key:{key} has out of bounds chunk: tensor-size:{value.size}")
        elif len(chunks) > 1:
            sweep = int(np.argmax(size))
            order = np.argsort(offsets[:, sweep], kind="stable")
            start = offsets[order, sweep]
            end = start + sizes[order, sweep]
            if (end[:-1] > start[1:]).any():
                ordered = boxes[order]
                if (ordered[1:] == ordered[:-1]).all(axis=1).any():
                    replicated = True  # the same chunk twice: deduplicated, then checked
                    continue
                # not disjoint along one dimension (2-D tilings): DCP's sweep-line check
                one = Metadata(state_dict_metadata={key: value})
                errors += _validate_global_plan([SavePlan([])] * n_plans, one)
                continue
        volume = int(np.prod(sizes, axis=1).sum())
        if n_plans > 1 and volume != math.prod(value.size):
            errors.append(
                f"key:{key} invalid fill tensor-volume: {math.prod(value.size)} "
                f"chunks-volume: {volume}"
            )
    remember_rows(memo)  # the metadata encoding of this save reuses them (dcp_metadata)
    return errors, replicated
