"""accelerate on 2 processes (gloo, CPU, DDP), each its own node, with the tiers switched on by
``shardpoint_local_directory=``: one node's local tier is wiped and a new 2-process job resumes
with that process's state from the other node's replica, exactly (each process's losses, the
final parameters and the registered object equal the uninterrupted run's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

from integration_helpers.common import run_ranks  # noqa: E402


def test_a_replaced_node_resumes_from_its_peer(tmp_path: Path) -> None:
    straight, tiered = tmp_path / "straight", tmp_path / "tiered"
    first = run_ranks(
        "accel_run", "shardpoint", str(straight), "3", ";",
        "shardpoint-tiers-nodes", str(tiered), "2",
    )  # fmt: skip
    # each process keeps its own part and a replica of the other's
    for rank, other in ((0, 1), (1, 0)):
        node = tiered / f"node-{rank}" / f"rank-{rank:05d}"
        assert (node / "own" / "ckpt-2.tier-commit.json").exists()
        assert (node / f"replica-{other:05d}" / "ckpt-2.tier-commit.json").exists()
    shutil.rmtree(tiered / "node-1")  # the node of process 1 was replaced
    resumed = run_ranks("accel_run", "shardpoint-tiers-nodes", str(tiered), "3", "latest")
    for rank in (0, 1):
        full, part = first[rank]
        (got,) = resumed[rank]
        per_epoch = len(full["losses"]) // 3
        assert part["losses"] == full["losses"][: 2 * per_epoch]
        assert got["tier_step"] == 2 and got["tiers"] == ["local", "peer"]
        assert got["losses"] == full["losses"][2 * per_epoch :]
        assert got["digest"] == full["digest"] and got["progress"] == full["progress"]
    assert first[0][0]["losses"] != first[1][0]["losses"]  # each process saw its own batches
