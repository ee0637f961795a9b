"""A ``torch.distributed.checkpoint`` load planner whose per-rank step does not grow with the
number of ranks that saved (docs/SCALE.md, issue 42).

DCP's ``DefaultLoadPlanner`` builds each rank's read items by sweeping every stored chunk of
every tensor the rank loads (``create_read_items_for_chunk_list``: bounds, a sort and a scan
over all N chunks), so with N saving ranks each of the M loading ranks pays O(N log N) per
tensor in Python. :class:`LoadPlanner` finds the stored chunks a local chunk overlaps by
binary search over the stored chunks' extents along the first dimension (an int64 table,
taken from the chunk table the metadata was decoded from, :mod:`.dcp_metadata`, so the chunk
objects are not walked), then hands only those to DCP's own resharding code, which builds the
read items exactly as it would have. O(k log N) per local chunk for k overlapping stored
chunks; a tensor whose stored chunks are not disjoint along the first dimension (2-D
tilings) goes through DCP's code unchanged.

Use it with shardpoint's StorageReader: ``dcp.load(sd, storage_reader=StorageReader(p),
planner=LoadPlanner())``. Reads are what the plan asks for: the StorageReader reads only the
rows of a stored chunk a read item needs (compressed: the chunks of ``chunk_bytes`` holding
them; uncompressed: the 16 KiB crc blocks holding them, FORMAT.md §3.4).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import _version
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import (
    _create_chunk_list,
    _create_read_items,
    create_read_items_for_chunk_list,
)
from torch.distributed.checkpoint.protocol import _is_checkpointable_tensor
from torch.distributed.tensor import DTensor

from .dcp_metadata import rows_of

__all__ = ["LoadPlanner"]

#: up to this many stored chunks a tensor goes through DCP's scan (nothing to search)
_SMALL = 1


@dataclasses.dataclass
class _Extents:
    """The stored chunks of one tensor sorted along dimension 0: original positions, starts
    and ends (ends ascending too: the chunks are disjoint along that dimension)."""

    chunks: list[Any]
    order: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def _extents(md: TensorStorageMetadata) -> _Extents | None:
    """The sorted extents of ``md``'s chunks along dimension 0, or None when they overlap
    there (or the tensor is 0-d): then DCP's own scan handles the tensor."""
    dims = len(md.size)
    if dims == 0:
        return None
    rows = rows_of(md.chunks, dims)
    if rows is None:
        return None
    starts = rows[:, 0]
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = starts + rows[order, dims]
    if len(starts) > 1 and (ends[:-1] > starts[1:]).any():
        return None
    return _Extents(md.chunks, order, starts, ends)


class LoadPlanner(DefaultLoadPlanner):
    """DCP ``DefaultLoadPlanner`` whose local plan looks up the stored chunks a rank needs by
    binary search instead of scanning all of them (module docstring). Same arguments."""

    state_dict: dict[str, Any]  # set by DefaultLoadPlanner.set_up_planner

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # per stored tensor (by id, the metadata object held in the value): its extents
        self._extents: dict[int, tuple[TensorStorageMetadata, _Extents | None]] = {}

    def create_local_plan(self) -> LoadPlan:
        metadata = self.metadata
        if metadata is None:
            raise AssertionError("set_up_planner was not given the checkpoint's metadata")
        if self.flatten_state_dict:
            self._accept_pre_2_4_keys(metadata)
        strict = not self.allow_partial_load
        items: list[ReadItem] = []
        stored = metadata.state_dict_metadata
        for fqn, obj in self.state_dict.items():
            md = stored.get(fqn)
            if md is None:
                if strict:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
                continue
            if isinstance(md, TensorStorageMetadata) and getattr(obj, "size", None) is not None:
                size = (
                    torch.Size(obj.global_shape) if _is_checkpointable_tensor(obj) else obj.size()
                )
                if md.size != size:
                    raise ValueError(
                        f"Size mismatch between saved {md.size} and current: {size} for {fqn}"
                    )
            if isinstance(obj, DTensor) and obj.device_mesh.get_coordinate() is None:
                continue  # this rank is not in the tensor's mesh
            if isinstance(md, TensorStorageMetadata) and len(md.chunks) > _SMALL:
                items += self._read_items(fqn, md, obj)
            else:
                items += _create_read_items(fqn, md, obj)
        return LoadPlan(items)

    def _accept_pre_2_4_keys(self, metadata: Metadata) -> None:
        """Checkpoints saved by torch before 2.4 flattened keys another way: when keys of the
        checkpoint are missing from the state dict and the old flattening has them, use it
        (what ``DefaultLoadPlanner`` does)."""
        missing = set(metadata.state_dict_metadata) - set(self.state_dict)
        if not missing:
            return
        _version._derived_version = "2_3"
        try:
            old, old_mappings = flatten_state_dict(self.original_state_dict)
        finally:
            _version._derived_version = None
        if set(old) & missing:
            self.state_dict, self.mappings = old, old_mappings

    def _read_items(self, fqn: str, md: TensorStorageMetadata, obj: Any) -> list[ReadItem]:
        cached = self._extents.get(id(md))
        if cached is None or cached[0] is not md:
            cached = (md, _extents(md))
            self._extents[id(md)] = cached
        ext = cached[1]
        local = _create_chunk_list(obj)
        if ext is None or len(ext.chunks) != len(md.chunks):
            return create_read_items_for_chunk_list(fqn, md, local)
        picked: set[int] = set()
        for chunk in local:
            lo = int(chunk.offsets[0])
            hi = lo + int(chunk.sizes[0])
            first = int(np.searchsorted(ext.ends, lo, side="right"))
            last = int(np.searchsorted(ext.starts, hi, side="left"))
            picked.update(ext.order[first:last].tolist())
        if not picked:
            return []
        positions = sorted(picked)
        sub = TensorStorageMetadata(md.properties, md.size, [md.chunks[i] for i in positions])
        items = create_read_items_for_chunk_list(fqn, sub, local)
        # the storage index's hint is the chunk's position in the stored list, not in ``sub``
        # (a hint only: MetadataIndex equality ignores it, but readers may use it)
        return [
            dataclasses.replace(
                item,
                storage_index=MetadataIndex(
                    fqn, item.storage_index.offset, positions[item.storage_index.index]
                ),
            )
            for item in items
        ]
