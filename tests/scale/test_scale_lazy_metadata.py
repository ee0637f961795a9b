"""A loading rank's open in O(what it touches) (docs/SCALE.md, issue 42): ``read_metadata``
builds DCP's ``Metadata`` over the int64 chunk table (``torch/dcp_lazy.py``): chunks built when
read, ``storage_data`` derived on lookup. Here, at N = 16 simulated saving ranks: the lazy
metadata equals the eager one (the global plan's ``Metadata`` and the keys the writer's rule
gives), behaves as a list and a dict (indexing, slicing, pickling, changing), loads bit-exact
through DCP's DefaultLoadPlanner and ours, reads a checkpoint whose table is uncompressed (as
written before it was compressed), and refuses a chunk table that is damaged on disk or
describes chunks outside their tensor, naming the tensor, chunk and offset."""

from __future__ import annotations

import copy
import glob
import pickle
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata,
    MetadataIndex,
)

import scale_harness as h  # noqa: E402
import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402
from shardpoint.torch.dcp import _storage_key  # noqa: E402
from shardpoint.torch.dcp_lazy import DerivedStorageData, LazyChunks  # noqa: E402
from shardpoint.torch.dcp_metadata import decode_metadata, rows_of  # noqa: E402
from shardpoint.torch.dcp_planners import SavePlanner  # noqa: E402

N, M, TENSORS, ROWS, COLS = 16, 8, 12, 2, 5  # a 6 KB table: compressed (over 4 KiB)
TABLE = ".dcp_metadata.chunks"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("lazy") / "ckpt")
    h.dcp_save(prefix, N, tensors=TENSORS, rows=ROWS, cols=COLS, planner="ours")
    return prefix


def _eager() -> tuple[dict, dict]:
    """The reference: the ``state_dict_metadata`` of the coordinator's global plan (plain
    lists of chunks) and the keys the writer stored each item under (``_storage_key``)."""
    plans = h.dcp_rank_plans(N, TENSORS, ROWS, COLS)
    planner = SavePlanner(cache_key=uuid.uuid4().hex)
    planner.set_up_planner({}, None, True)
    _, md = planner.create_global_plan(plans)
    keys = {
        MetadataIndex(it.index.fqn, it.index.offset): _storage_key(it)
        for plan in plans
        for it in plan.items
    }
    return md.state_dict_metadata, keys


def test_lazy_metadata_equals_the_eager_one(saved: str) -> None:
    md = spt.StorageReader(saved).read_metadata()
    sdm, keys = _eager()
    assert set(md.state_dict_metadata) == set(sdm)
    for fqn, want in sdm.items():
        got = md.state_dict_metadata[fqn]
        assert isinstance(got.chunks, LazyChunks)
        assert got.chunks == want.chunks and want.chunks == got.chunks  # both directions
        assert got == want  # DCP's dataclass equality, chunks included
    assert isinstance(md.storage_data, DerivedStorageData)
    assert len(keys) == N * TENSORS and "t001@4,0" in keys.values()
    assert md.storage_data == keys and keys == dict(md.storage_data)


def test_storage_data_lookups_without_building_the_chunks(saved: str) -> None:
    md = spt.StorageReader(saved).read_metadata()
    _, keys = _eager()
    sd = md.storage_data
    for index, key in keys.items():
        assert sd[MetadataIndex(index.fqn, index.offset)] == key  # no hint: the rows searched
        assert sd[MetadataIndex(index.fqn, index.offset, index=0)] == key  # a wrong hint
    assert sd[MetadataIndex("t002", (6, 0), index=3)] == "t002@6,0"
    for missing in (
        MetadataIndex("t002", (7, 0)),  # no chunk starts there
        MetadataIndex("t002", (6,)),  # another rank
        MetadataIndex("t002"),  # a tensor's items always have offsets
        MetadataIndex("nope", (0, 0)),
    ):
        assert missing not in sd
        with pytest.raises(KeyError):
            sd[missing]
    assert sd  # truthiness without building anything (DCP's readers test it)
    # the lookups built no chunk list: the planner's rows come straight from the table
    for fqn, value in md.state_dict_metadata.items():
        rows = rows_of(value.chunks, 2)
        assert rows is value.chunks.rows and rows.shape == (N, 4), fqn
        assert not rows.flags.writeable


def test_lazy_chunks_behave_as_a_list(saved: str) -> None:
    md = spt.StorageReader(saved).read_metadata()
    sdm, keys = _eager()
    chunks, want = md.state_dict_metadata["t001"].chunks, sdm["t001"].chunks
    assert len(chunks) == N
    assert chunks[3] is chunks[3]  # built once, then the same object
    assert chunks[-1] == want[-1] and chunks[1:4] == want[1:4]
    assert isinstance(chunks[0].offsets, torch.Size)
    with pytest.raises(IndexError):
        chunks[N]
    assert list(chunks) == want and chunks[3] is list(chunks)[3]
    # pickled or copied, a Metadata is plain lists and dicts (no shardpoint needed to read it)
    for back in (pickle.loads(pickle.dumps(md)), copy.deepcopy(md)):
        assert type(back.state_dict_metadata["t001"].chunks) is list
        assert type(back.storage_data) is dict and back.storage_data == keys
        assert back.state_dict_metadata == sdm
    # a change leaves the rows behind: the planner's rows then come from the chunks
    extra = ChunkStorageMetadata(torch.Size([N * ROWS, 0]), torch.Size([0, COLS]))
    chunks.append(extra)
    assert chunks.rows is None and len(chunks) == N + 1 and chunks[-1] is extra
    rows = rows_of(chunks, 2)
    assert rows is not None and rows.shape == (N + 1, 4)
    assert rows[-1].tolist() == [N * ROWS, 0, 0, COLS]
    del chunks[-1]
    assert chunks == want


@pytest.mark.parametrize("planner", ["ours", "dcp"])
def test_resharded_loads_are_bit_exact(saved: str, planner: str) -> None:
    """N = 16 -> M = 8 through our StorageReader and each planner (the harness checks every
    loading rank's values bit-exact)."""
    run = h.dcp_load(saved, N, M, tensors=TENSORS, rows=ROWS, cols=COLS, planner=planner)
    assert len(run.read_metadata_cpu_s) == M


def test_real_dcp_round_trip_with_whole_tensors_and_objects(tmp_path) -> None:
    """A single-process ``dcp.save``: a tensor saved whole is keyed by its name, a non-tensor
    by its name; both planners load everything back."""
    state = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5), "step": 7}
    dcp.save(state, storage_writer=spt.StorageWriter(tmp_path / "c"), no_dist=True)
    md = spt.StorageReader(tmp_path / "c").read_metadata()
    assert md.storage_data[MetadataIndex("w", (0, 0))] == "w"
    assert md.storage_data[MetadataIndex("step")] == "step"
    assert MetadataIndex("step", (0,)) not in md.storage_data
    assert dict(md.storage_data) == {
        MetadataIndex("w", (0, 0)): "w",
        MetadataIndex("b", (0,)): "b",
        MetadataIndex("step"): "step",
    }
    for planner in (spt.LoadPlanner(), DefaultLoadPlanner()):
        back = {"w": torch.zeros(3, 4), "b": torch.zeros(5), "step": 0}
        reader = spt.StorageReader(tmp_path / "c")
        dcp.load(back, storage_reader=reader, planner=planner, no_dist=True)
        assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])
        assert back["step"] == 7


def test_an_uncompressed_table_still_loads(saved: str, tmp_path) -> None:
    """Checkpoints written before the table was compressed: the same entries rewritten with
    ``compression="none"`` load through both planners, bit-exact."""
    old = str(tmp_path / "old")
    with sp.open(saved) as r, sp.Writer(old, compression="none") as w:
        assert r.info(TABLE).codec != "none" and r.info(TABLE).stored_bytes < N * TENSORS * 32 // 4
        for key in r.keys():
            w.add(key, r[key])
    with sp.open(old) as r:
        assert r.info(TABLE).codec == "none"
    want = spt.StorageReader(saved).read_metadata()
    got = spt.StorageReader(old).read_metadata()
    assert got.state_dict_metadata == want.state_dict_metadata
    for planner in ("ours", "dcp"):
        h.dcp_load(old, N, M, tensors=TENSORS, rows=ROWS, cols=COLS, planner=planner)


def test_a_chunk_outside_its_tensor_is_refused(saved: str) -> None:
    with sp.open(saved) as r:
        document, table = r[".dcp_metadata"], np.array(r[TABLE])
    base = 2 * 2 * N  # t001's rows follow t000's N chunks of 4 values
    chunk5 = base + 4 * 5  # its offsets, then its sizes
    for changes in (
        {chunk5 + 2: N * ROWS},  # rows past the tensor's end
        {chunk5 + 1: -1},  # a negative offset
        {chunk5: 2**62, chunk5 + 2: 2**62},  # an end that overflows int64
    ):
        bad = table.copy()
        for at, value in changes.items():
            bad[at] = value
        with pytest.raises(
            sp.CorruptCheckpointError,
            match=rf"chunk 5 of 't001' \(table value {base + 20}\) is outside the tensor",
        ):
            decode_metadata(document, bad)
    assert decode_metadata(document, table).state_dict_metadata["t001"].size == (N * ROWS, COLS)


def test_a_damaged_chunk_table_is_refused(tmp_path) -> None:
    prefix = str(tmp_path / "ckpt")
    h.dcp_save(prefix, N, tensors=TENSORS, rows=2, cols=3, planner="ours")
    with sp.open(prefix) as r:
        info = r.info(TABLE)
    assert info.codec != "none"  # a flipped byte inside a compressed chunk
    (shard,) = glob.glob(f"{prefix}.data-{info.shard:05d}-of-*")
    with open(shard, "r+b") as f:
        f.seek(info.offset + info.stored_bytes // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(sp.CorruptCheckpointError, match=r"\.dcp_metadata\.chunks"):
        spt.StorageReader(prefix).read_metadata()
