"""``torch.distributed.checkpoint`` with an existing directory as the path, as DCP's own
``FileSystemWriter(dir)`` is given one: the checkpoint goes inside it (``DIR/checkpoint``).

Regression: a directory was taken as a prefix, so the files landed beside it (``DIR.index``,
outside a ``tempfile.TemporaryDirectory``'s cleanup) and the commit, removing an empty ``P/``
as a hashed-prefix leftover, deleted the (empty) directory itself; writing ``DIR/model.pt``
next then failed ("Parent directory ... does not exist"). Found by PyTorch's own
``test_format_utils.py::test_dcp_to_torch_save`` run with shardpoint's writer
(tests/integrations/upstream/torch_dcp)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint as dcp  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402


def _state() -> dict[str, object]:
    return {"a": torch.arange(15.0).reshape(5, 3), "n": 3}


def test_existing_directory_gets_the_checkpoint_inside(tmp_path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    dcp.save(_state(), storage_writer=spt.StorageWriter(d))
    assert d.is_dir()  # not removed by the commit
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # nothing beside it
    assert "checkpoint.index" in os.listdir(d)
    for reader in (spt.StorageReader(d), spt.StorageReader(d / "checkpoint")):
        target = {"a": torch.zeros(5, 3), "n": 0}
        dcp.load(target, storage_reader=reader)
        assert torch.equal(target["a"], _state()["a"]) and target["n"] == 3
    with sp.open(d) as r:  # a directory holding one checkpoint opens as that one
        assert "a" in r
    # a second save to the same directory replaces the first, in place
    dcp.save({"a": torch.ones(5, 3), "n": 4}, storage_writer=spt.StorageWriter(d))
    target = {"a": torch.zeros(5, 3), "n": 0}
    dcp.load(target, checkpoint_id=d)  # DCP's own reader selection finds ours
    assert torch.equal(target["a"], torch.ones(5, 3)) and target["n"] == 4
    # the directory keeps the user's other files; one written after the save is fine too
    torch.save({"x": 1}, d / "model.pt")
    assert sorted(os.listdir(d))[-2:] == ["checkpoint.index", "model.pt"]


def test_directory_made_after_the_writer_is_used(tmp_path) -> None:
    d = tmp_path / "later"
    writer = spt.StorageWriter(d)
    d.mkdir()
    dcp.save(_state(), storage_writer=writer)
    assert os.path.exists(d / "checkpoint.index") and not os.path.exists(f"{d}.index")


def test_prefix_paths_are_unchanged(tmp_path) -> None:
    p = tmp_path / "step-100"  # no such directory: a prefix, as before
    dcp.save(_state(), storage_writer=spt.StorageWriter(p))
    assert os.path.exists(f"{p}.index") and not p.exists()
    # the hashed-prefix directory P/ beside P.index stays a prefix's, not a directory to save in
    h = tmp_path / "h"
    dcp.save(_state(), storage_writer=spt.StorageWriter(h, hashed_prefixes=True))
    assert h.is_dir() and os.path.exists(f"{h}.index")
    dcp.save(_state(), storage_writer=spt.StorageWriter(h, hashed_prefixes=True))
    assert not os.path.exists(h / "checkpoint.index")
    target = {"a": torch.zeros(5, 3), "n": 0}
    dcp.load(target, storage_reader=spt.StorageReader(h))
    assert torch.equal(target["a"], _state()["a"])
