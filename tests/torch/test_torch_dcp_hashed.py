"""``torch.distributed.checkpoint`` with ``StorageWriter(hashed_prefixes=True)`` (FORMAT.md
§3.1.1): the shards of the save land under ``prefix/HH/`` and ``StorageReader`` loads them."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint as dcp  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402


def test_dcp_save_and_load_with_hashed_prefixes(tmp_path) -> None:
    p = tmp_path / "c"
    state = {"a": torch.arange(15.0).reshape(5, 3), "b": torch.ones(7, dtype=torch.int64), "n": 3}
    dcp.save(state, storage_writer=spt.StorageWriter(p, hashed_prefixes=True, threads=2))
    with sp.open(p) as r:
        r.verify()
        shards = [os.fspath(s) for s, _ in r.format_info["shards"]]
    assert shards and all(s.startswith(f"{p}/") and "/data-" in s for s in shards), shards
    assert sorted(os.listdir(tmp_path)) == ["c", "c.index"]  # no shard beside the index
    target = {"a": torch.zeros(5, 3), "b": torch.zeros(7, dtype=torch.int64), "n": 0}
    dcp.load(target, storage_reader=spt.StorageReader(p))
    assert torch.equal(target["a"], state["a"]) and torch.equal(target["b"], state["b"])
    assert target["n"] == 3
