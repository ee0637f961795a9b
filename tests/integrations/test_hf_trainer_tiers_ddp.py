"""The Hugging Face Trainer on 2 processes (DDP on gloo, CPU), each its own node, with the tiers
switched on by ``shardpoint_local_directory=``: the job stops at step 7 of 8, one node's local
tier is wiped, and ``train(resume_from_checkpoint=True)`` in a new 2-process job resumes from
step 6 with that process's state from the other node's replica, each process's losses and the
final parameters bit-identical to the uninterrupted run (integration_helpers.hf_run, kind
``shardpoint-tiers-nodes``). About a minute and a half on 2 loaded cores."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from integration_helpers.common import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_replaced_node_resumes_from_its_peer(tmp_path: Path) -> None:
    tiered, straight = tmp_path / "tiered", tmp_path / "straight"
    first = run_ranks(
        "hf_run", "shardpoint-tiers-nodes", str(tiered), "8", env={"SP_TEST_STOP_AT": "7"}
    )
    for rank, other in ((0, 1), (1, 0)):
        node = tiered / f"node-{rank}" / f"rank-{rank:05d}"
        assert (node / "own" / "ckpt-6.tier-commit.json").exists()
        assert (node / f"replica-{other:05d}" / "ckpt-6.tier-commit.json").exists()
    shutil.rmtree(tiered / "node-1")
    second = run_ranks(
        "hf_run", "shardpoint", str(straight), "8", ";",
        "shardpoint-tiers-nodes", str(tiered), "8", "true",
    )  # fmt: skip
    for rank in (0, 1):
        (stopped,) = first[rank]
        full, resumed = second[rank]
        assert stopped["losses"] == full["losses"][:7]
        assert resumed["tier_step"] == 6 and resumed["tiers"] == ["local", "peer"]
        assert resumed["losses"] == full["losses"][6:]
        assert resumed["digest"] == full["digest"] and resumed["global_step"] == 8
    assert second[0][0]["losses"] != second[1][0]["losses"]  # each process its own batches
    # the straight run's checkpoints keep each process's generators as Trainer names them
    # (rng_state_<i>.pth), shardpoint single files that torch.load reads
    import torch

    ck = straight / "checkpoint-6"
    states = [torch.load(ck / f"rng_state_{r}.pth", weights_only=True) for r in (0, 1)]
    assert all((ck / f"rng_state_{r}.pth").read_bytes()[:8] == b"SPSINGLE" for r in (0, 1))
    assert not (ck / "rng_state.pth").exists()
    assert all(isinstance(st["python"], tuple) for st in states)
    from shardpoint.integrations import hf_trainer

    assert hf_trainer.load_checkpoint(ck)["rng"]["python"] == states[0]["python"]  # rank 0's
