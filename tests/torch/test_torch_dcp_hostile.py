"""Hostile DCP metadata (bytes from disk are hostile, DESIGN.md §3): a ``.dcp_metadata``
document or chunk table that a StorageWriter cannot have written is refused by
``StorageReader.read_metadata`` with a CorruptCheckpointError naming the checkpoint, the entry
and the field, never a builtin TypeError/KeyError from deep inside the decoder, an allocation
sized by a count from the file, or a metadata that loads the wrong bytes. Each test writes its
hostile checkpoint from a real single-process ``dcp.save``: the entries are read, one field is
changed, and the entries are saved again (checksums then match: the damage is in the content)."""

from __future__ import annotations

import copy
import traceback
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402

DOC, TABLE = ".dcp_metadata", ".dcp_metadata.chunks"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The entries and metadata of a real save: a 2-d tensor, a scalar, a non-tensor."""
    prefix = str(tmp_path_factory.mktemp("dcp") / "ck")
    state = {"w": torch.arange(12.0).reshape(3, 4), "s": torch.tensor(2.5), "step": 7}
    dcp.save(state, storage_writer=spt.StorageWriter(prefix), no_dist=True)
    with sp.open(prefix) as r:
        return r.load(), dict(r.metadata)


def _rewrite(tmp_path, saved, change) -> str:
    """A checkpoint of ``saved``'s entries after ``change(document, entries)``."""
    entries, meta = saved
    entries = dict(entries)
    document = copy.deepcopy(entries[DOC])
    change(document, entries)
    entries[DOC] = document
    prefix = str(tmp_path / "bad")
    sp.save_file(entries, prefix, metadata=meta)
    return prefix


def _refused(prefix: str, match: str) -> sp.CorruptCheckpointError:
    with pytest.raises(sp.CorruptCheckpointError, match=match) as e:
        spt.StorageReader(prefix).read_metadata()
    assert prefix in str(e.value)  # the checkpoint is named, not only the entry
    return e.value


def _tensor_row(document: dict[str, Any], fqn: str) -> list[Any]:
    (row,) = [t for t in document["tensors"] if t[0] == fqn]
    return row


def test_the_unchanged_save_reads(tmp_path, saved) -> None:
    """The baseline the hostile variants are made from decodes (so each refusal below is
    the changed field's doing)."""
    md = spt.StorageReader(_rewrite(tmp_path, saved, lambda d, e: None)).read_metadata()
    assert md.state_dict_metadata["w"].size == (3, 4)
    assert len(md.state_dict_metadata["s"].chunks) == 1


@pytest.mark.parametrize("version", ["2", None, -1, 2.5, True, [2]])
def test_a_version_that_is_not_a_version(tmp_path, saved, version) -> None:
    def change(d: dict[str, Any], _: Any) -> None:
        d["version"] = version

    _refused(_rewrite(tmp_path, saved, change), r"\.dcp_metadata: version .* is not a metadata")


def test_a_newer_version_is_unsupported(tmp_path, saved) -> None:
    prefix = _rewrite(tmp_path, saved, lambda d, e: d.update(version=3))
    with pytest.raises(sp.UnsupportedFormatError, match="version 3 was written by a newer"):
        spt.StorageReader(prefix).read_metadata()


def test_missing_fields(tmp_path, saved) -> None:
    _refused(_rewrite(tmp_path, saved, lambda d, e: d.pop("metadata")), "no 'metadata' field")
    prefix = _rewrite(tmp_path, saved, lambda d, e: d.pop("tensors"))
    _refused(prefix, "version 2 without its chunk table")
    prefix = _rewrite(tmp_path, saved, lambda d, e: e.pop(TABLE))
    _refused(prefix, "version 2 without its chunk table")


@pytest.mark.parametrize(
    ("tagged", "why"),
    [
        ({"__size": "abc"}, "TypeError"),
        ({"__index": [1]}, "ValueError"),
        ({"__dc": "Metadata", "fields": [1]}, "AttributeError"),
        ({"__dc": "Metadata", "fields": {"bogus": 1}}, "TypeError: .*unexpected keyword"),
        ({"__dict": [[1]]}, "ValueError"),
        ({"__float": [1]}, "TypeError"),
        ({"__path": 5}, "TypeError"),
    ],
)
def test_malformed_tagged_values(tmp_path, saved, tagged, why) -> None:
    def change(d: dict[str, Any], _: Any) -> None:
        d["metadata"]["fields"]["planner_data"] = tagged

    _refused(_rewrite(tmp_path, saved, change), rf"malformed metadata \({why}")


def _sdm(d: dict[str, Any]) -> dict[str, Any]:
    return d["metadata"]["fields"]["state_dict_metadata"]


@pytest.mark.parametrize(
    ("sdm", "match"),
    [
        ([1, 2], "state_dict_metadata is not a dict"),
        ({"__dict": [["a", 5]]}, "'a' is described by a int"),
        ({"__dict": [[["a"], {"__dc": "BytesStorageMetadata", "fields": {}}]]}, "key .* not a str"),
    ],
)
def test_state_dict_metadata_of_the_wrong_shape(tmp_path, saved, sdm, match) -> None:
    def change(d: dict[str, Any], _: Any) -> None:
        d["metadata"]["fields"]["state_dict_metadata"] = sdm

    _refused(_rewrite(tmp_path, saved, change), match)


def test_tensor_properties_that_are_not_torch_constants(tmp_path, saved) -> None:
    def change(d: dict[str, Any], _: Any) -> None:
        _tensor_row(d, "w")[1]["fields"]["dtype"] = "float32"

    _refused(
        _rewrite(tmp_path, saved, change), r"tensor 'w': dtype 'float32' is not a torch\.dtype"
    )

    def unknown(d: dict[str, Any], _: Any) -> None:
        _tensor_row(d, "w")[1]["fields"]["dtype"] = {"__torch": "Tensor"}

    _refused(_rewrite(tmp_path, saved, unknown), "unknown torch constant 'Tensor'")


def test_a_scalar_with_a_huge_chunk_count(tmp_path, saved) -> None:
    """A scalar's chunks take no table values, so no table bound stops a count from the file:
    the count itself is refused (it would size the chunk list built when the metadata is
    iterated: a MemoryError or a hang before)."""

    def change(d: dict[str, Any], _: Any) -> None:
        _tensor_row(d, "s")[3] = 10**15

    _refused(_rewrite(tmp_path, saved, change), "tensor 's' of 0 dimensions with 1000000000000000")


def test_a_tensor_described_twice(tmp_path, saved) -> None:
    """A second row for a name would silently replace the first's chunks."""

    def change(d: dict[str, Any], entries: dict[str, Any]) -> None:
        d["tensors"].append(copy.deepcopy(_tensor_row(d, "w")))
        entries[TABLE] = np.concatenate([entries[TABLE], entries[TABLE][:4]])

    _refused(_rewrite(tmp_path, saved, change), "tensor 'w' described twice")


def test_a_chunk_count_past_the_table(tmp_path, saved) -> None:
    def change(d: dict[str, Any], _: Any) -> None:
        _tensor_row(d, "w")[3] = 2**62

    _refused(_rewrite(tmp_path, saved, change), r"'w' needs chunks past the table's end")


@pytest.mark.parametrize("table", [np.zeros(8, np.float64), np.zeros((2, 4), np.int64)])
def test_a_table_that_is_not_1d_int64(tmp_path, saved, table: np.ndarray) -> None:
    """Refused from the table's index record, before it is read."""

    def change(d: dict[str, Any], entries: dict[str, Any]) -> None:
        entries[TABLE] = table

    _refused(_rewrite(tmp_path, saved, change), r"the chunk table is a 1-d int64 tensor")


def test_a_table_larger_than_the_checkpoint_can_describe(tmp_path, saved) -> None:
    """A compressed table may declare far more values than its bytes on disk (zeros compress
    a thousandfold): it is refused from its index record, before anything is decompressed,
    when it holds more than 2 x 64 values per entry of the checkpoint (each chunk is an entry
    and holds its offsets and sizes)."""
    entries = len(saved[0])
    cap = 2 * 64 * entries

    def change(d: dict[str, Any], e: dict[str, Any]) -> None:
        e[TABLE] = np.zeros(cap + 1, np.int64)

    prefix = _rewrite(tmp_path, saved, change)
    with sp.open(prefix) as r:
        assert r.info(TABLE).codec != "none" and r.info(TABLE).stored_bytes < cap
    _refused(prefix, rf"at most {cap} values in a checkpoint of {entries} entries")


def _version_1(d: dict[str, Any], chunk_offsets: list[int], chunk_sizes: list[int]) -> None:
    """``d`` as a version 1 document (stored whole, chunks and storage data in the JSON)
    describing ``w`` by one chunk with the given offsets and sizes."""
    props = _tensor_row(d, "w")[1]
    chunk = {
        "__dc": "ChunkStorageMetadata",
        "fields": {"offsets": {"__size": chunk_offsets}, "sizes": {"__size": chunk_sizes}},
    }
    w = {
        "__dc": "TensorStorageMetadata",
        "fields": {"properties": props, "size": {"__size": [3, 4]}, "chunks": [chunk]},
    }
    d["version"] = 1
    d.pop("tensors")
    _sdm(d)["__dict"] = [["w", w]]
    index = {"__index": ["w", {"__size": chunk_offsets}, 0]}
    d["metadata"]["fields"]["storage_data"] = {"__dict": [[index, "w"]]}


def test_version_1_chunks_are_checked_too(tmp_path, saved) -> None:
    """Version 1 documents (still read) carry their chunks in the JSON: the same bounds as
    the table's apply (none were checked before)."""
    ok = _rewrite(tmp_path, saved, lambda d, e: _version_1(d, [0, 0], [3, 4]))
    md = spt.StorageReader(ok).read_metadata()
    assert md.state_dict_metadata["w"].chunks[0].sizes == (3, 4)
    back = {"w": torch.zeros(3, 4)}
    dcp.load(back, storage_reader=spt.StorageReader(ok), no_dist=True)
    assert torch.equal(back["w"], torch.arange(12.0).reshape(3, 4))
    for offsets, sizes, match in (
        ([0, 1], [3, 4], r"chunk 0 of 'w' is outside the tensor"),
        ([-1, 0], [3, 4], r"chunk 0 offsets .* is malformed"),
        ([0, 0], [3], r"chunk 0 of 'w' has 2/1 dimensions"),
    ):
        bad = _rewrite(tmp_path, saved, lambda d, e, o=offsets, s=sizes: _version_1(d, o, s))
        _refused(bad, match)


def test_version_1_storage_data_must_name_entries(tmp_path, saved) -> None:
    def change(d: dict[str, Any], _: Any) -> None:
        _version_1(d, [0, 0], [3, 4])
        d["metadata"]["fields"]["storage_data"]["__dict"][0][1] = 5

    _refused(_rewrite(tmp_path, saved, change), "storage_data is not a mapping")


@pytest.mark.parametrize("size", [[2, 4], [6, 4], [3, 5]])
@pytest.mark.parametrize("planner", ["ours", "dcp"])
def test_a_stored_entry_of_another_shape_than_its_chunk(tmp_path, saved, size, planner) -> None:
    """The metadata says ``w`` is ``size`` in one chunk; its stored entry is 3 x 4. A smaller
    chunk loaded the entry's first rows as if they were all of ``w`` (silently wrong); now
    every read checks the entry against its chunk, naming the entry and the chunk."""

    def change(d: dict[str, Any], entries: dict[str, Any]) -> None:
        _tensor_row(d, "w")[2] = size
        entries[TABLE] = np.array([0, 0, *size], np.int64)

    prefix = _rewrite(tmp_path, saved, change)
    back = {"w": torch.zeros(*size), "s": torch.tensor(0.0)}
    chosen = spt.LoadPlanner() if planner == "ours" else DefaultLoadPlanner()
    # dcp.load wraps the reader's error in its CheckpointException, whose text carries it
    with pytest.raises(CheckpointException) as e:
        dcp.load(back, storage_reader=spt.StorageReader(prefix), planner=chosen, no_dist=True)
    text = "".join(traceback.format_exception(e.value))
    assert (
        f"{prefix}: entry 'w' holds shape (3, 4), the metadata's chunk of 'w' at offsets " in text
    )
    assert not back["w"].any()  # nothing was copied in


def test_the_checks_keep_what_a_custom_planner_writes() -> None:
    """Tensor metadata off the table's fast path (a tuple size, list offsets: a custom
    planner's) travels in the tagged JSON: the checks accept it as written."""
    from torch.distributed.checkpoint import metadata as md

    from shardpoint.torch.dcp_metadata import decode_metadata, encode_metadata

    props = md.TensorProperties(dtype=torch.float32)
    chunks = [md.ChunkStorageMetadata(offsets=[0, 0], sizes=[3, 4])]  # type: ignore[arg-type]
    w = md.TensorStorageMetadata(properties=props, size=(3, 4), chunks=chunks)  # type: ignore[arg-type]
    encoded = encode_metadata(md.Metadata(state_dict_metadata={"w": w}))
    assert encoded is not None
    document, table = encoded
    assert "w" not in [t[0] for t in document["tensors"]]  # in the JSON, not the table
    assert decode_metadata(document, table).state_dict_metadata["w"] == w
    chunks[0].sizes[1] = 5  # type: ignore[index]  # past the tensor: refused as any other
    document, table = encode_metadata(md.Metadata(state_dict_metadata={"w": w}))  # type: ignore[misc]
    with pytest.raises(sp.CorruptCheckpointError, match=r"chunk 0 of 'w' is outside the tensor"):
        decode_metadata(document, table)
