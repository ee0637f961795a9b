"""shardpoint's DCP save planner (torch/dcp_planners.py): the same global plan and metadata as
DCP's DefaultSavePlanner from an O(N) step, the plan cache (unchanged layouts reuse the
cached global plan; a changed rank is replanned with the others' cached plans), DCP's
validation rules, and the version 2 metadata (chunk table) read back with resharding."""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (  # noqa: E402
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

import scale_harness as h  # noqa: E402
import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402
from shardpoint.torch.dcp_metadata import decode_metadata, encode_metadata  # noqa: E402
from shardpoint.torch.dcp_planners import SavePlanner  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
N = 64


def _ours() -> SavePlanner:
    p = SavePlanner(cache_key=uuid.uuid4().hex)  # a cache of its own per test
    p.set_up_planner({}, None, True)
    return p


def _shard(fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...], size: tuple[int, ...]):
    o = torch.Size(offsets)
    return WriteItem(
        index=MetadataIndex(fqn, o),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=o, sizes=torch.Size(sizes)),
            properties=TensorProperties(dtype=torch.float32),
            size=torch.Size(size),
        ),
    )


def test_same_plan_and_metadata_as_dcp_and_the_cache() -> None:
    plans = h.dcp_rank_plans(N, 10, 1, 4)
    theirs = DefaultSavePlanner()
    theirs.set_up_planner({}, None, True)
    their_plans, their_md = theirs.create_global_plan(plans)
    ours = _ours()
    our_plans, our_md = ours.create_global_plan(plans)
    assert our_md.state_dict_metadata == their_md.state_dict_metadata
    assert our_plans == their_plans  # (index hints take no part in equality)
    assert not ours.global_plan_reused
    # nothing changed: every rank sends an empty plan; the cached metadata object comes back
    delta, md = ours.create_global_plan([SavePlan([], usable=False)] * N)
    assert ours.global_plan_reused and md is our_md
    assert all(not p.usable and not p.items for p in delta)
    # rank 3 adds a tensor (the others unchanged): only rank 3 gets a new plan
    changed = dataclasses.replace(plans[3], items=[*plans[3].items, _shard("x", (0,), (2,), (2,))])
    local = [SavePlan([], usable=False)] * N
    local[3] = changed
    delta, md = ours.create_global_plan(local)
    assert [i for i, p in enumerate(delta) if p.usable] == [3] and delta[3].items == changed.items
    assert "x" in md.state_dict_metadata and md.state_dict_metadata["t000"].chunks
    # another world size (resharded job): planned from scratch, cached plans are not used
    _, md = ours.create_global_plan(h.dcp_rank_plans(8, 2, 1, 4))
    assert not ours.global_plan_reused and len(md.state_dict_metadata["t000"].chunks) == 8
    with pytest.raises(sp.CheckpointError, match="cached"):
        _ours().create_global_plan([SavePlan([], usable=False)] * 2)


def test_duplicates_written_by_one_rank() -> None:
    plain = _shard("replicated", (0,), (3,), (3,))
    plain = dataclasses.replace(plain, type=WriteItemType.TENSOR)
    plans = [SavePlan([_shard("w", (r,), (1,), (4,)), plain]) for r in range(4)]
    out, md = _ours().create_global_plan(plans)
    assert sum(any(i.index.fqn == "replicated" for i in p.items) for p in out) == 1
    assert len(md.state_dict_metadata["w"].chunks) == 4


def test_replicated_shards_deduplicated() -> None:
    """The same shard on two ranks (a replicated placement): written once, still valid."""
    plans = [SavePlan([_shard("w", (r % 2,), (1,), (2,))]) for r in range(4)]
    out, md = _ours().create_global_plan(plans)
    assert sum(len(p.items) for p in out) == 2
    assert len(md.state_dict_metadata["w"].chunks) == 2


@pytest.mark.parametrize(
    "chunks, why",
    [
        ([((0,), (3,)), ((2,), (2,))], "overlapping"),
        ([((0,), (2,)), ((3,), (1,))], "invalid fill"),
        ([((0,), (2,)), ((2,), (3,))], "out of bounds"),
        ([((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2)), ((1, 1), (2, 2))], "overlapping"),
    ],
)
def test_dcp_validation_rules(chunks, why: str) -> None:
    size = (4,) * len(chunks[0][0])
    plans = [SavePlan([_shard("w", o, s, size)]) for o, s in chunks]
    with pytest.raises(ValueError, match=why):
        _ours().create_global_plan(plans)


def test_two_d_tiling_is_valid() -> None:
    """Chunks that overlap along every single dimension but not as boxes (DCP's check)."""
    tiles = [((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2)), ((2, 2), (2, 2))]
    plans = [SavePlan([_shard("w", o, s, (4, 4))]) for o, s in tiles]
    _, md = _ours().create_global_plan(plans)
    assert len(md.state_dict_metadata["w"].chunks) == 4


def test_metadata_v2_round_trip_and_hostile_table() -> None:
    plans = h.dcp_rank_plans(16, 3, 2, 5)
    _, md = _ours().create_global_plan(plans)
    document, table = encode_metadata(md)
    assert table.dtype == np.int64 and table.size == 16 * 3 * 4
    back = decode_metadata(document, table)
    assert back.state_dict_metadata == md.state_dict_metadata
    assert back.storage_data[MetadataIndex("t001", torch.Size([6, 0]))] == "t001@6,0"
    with pytest.raises(sp.CorruptCheckpointError, match="past the table"):
        decode_metadata(document, table[:-1])
    with pytest.raises(sp.CorruptCheckpointError, match="after the last"):
        decode_metadata(document, np.concatenate([table, table[:1]]))
    with pytest.raises(sp.CorruptCheckpointError, match="chunk table"):
        decode_metadata(document, None)


def test_harness_saves_then_a_resharded_load(tmp_path) -> None:
    """N simulated ranks through our planner and StorageWriter, the second save from the
    cached plans; one process loads the tensor whole (N shards -> 1), bit-exact."""
    prefix = str(tmp_path / "ckpt")
    first = h.dcp_save(prefix, N, tensors=4, planner="ours")
    again = h.dcp_save(prefix, N, tensors=4, planner="ours", previous=first)
    assert again.bytes_from_coordinator < first.bytes_from_coordinator / 4  # no items sent
    target = {"t002": torch.zeros(N, 4)}
    dcp.load(target, storage_reader=spt.StorageReader(prefix))
    want = torch.arange(N, dtype=torch.float32).repeat_interleave(4).reshape(N, 4)
    assert torch.equal(target["t002"], want)


def test_real_dcp_save_twice_with_the_planner(tmp_path) -> None:
    """``dcp.save(..., planner=SavePlanner())`` in one process: the second save (new values,
    same layout) reuses the plan and writes the new values."""
    key = uuid.uuid4().hex
    for step in (1, 2):
        state = {"a": torch.full((5, 3), float(step)), "n": step}
        planner = SavePlanner(cache_key=key)
        dcp.save(state, storage_writer=spt.StorageWriter(tmp_path / "c"), planner=planner)
        assert planner.local_plan_reused == planner.global_plan_reused == (step == 2)
        target = {"a": torch.zeros(5, 3), "n": 0}
        dcp.load(target, storage_reader=spt.StorageReader(tmp_path / "c"))
        assert torch.equal(target["a"], torch.full((5, 3), float(step))) and target["n"] == step
