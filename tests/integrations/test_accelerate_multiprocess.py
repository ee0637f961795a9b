"""accelerate on 2 processes (gloo, CPU, DDP) through ShardpointAccelerator: a run saves every
epoch, is SIGKILLed mid-save (process 0 kills itself while writing checkpoint_1, process 1 is
killed waiting for it) and a new 2-process job resumes from the newest committed checkpoint
exactly — each process's losses, the final parameters and the registered object equal the
uninterrupted run's and accelerate's own. Each process's RNG states are kept (rng_<i>), and
the shuffling sampler's generator that accelerate synchronizes across processes (accelerate's
own checkpoints do not keep it: resumed, they shuffle epoch 2 as epoch 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

from integration_helpers.common import pickles_under, run_ranks  # noqa: E402


def test_two_processes_killed_mid_save_resume_exactly(tmp_path: Path) -> None:
    ours_dir, native_dir, killed = tmp_path / "ours", tmp_path / "native", tmp_path / "killed"
    full = run_ranks(
        "accel_run", "shardpoint", str(ours_dir), "2", ";", "native", str(native_dir), "2"
    )
    for rank in (0, 1):
        ours, native = full[rank]
        assert ours == native
    assert full[0][0]["losses"] != full[1][0]["losses"]  # each process saw its own batches
    names = sorted(os.listdir(ours_dir / "checkpoints/checkpoint_0"))
    assert [n for n in names if ".data-" not in n] == [
        "model.safetensors",
        "rng_0.index",
        "rng_1.index",
        "shardpoint.index",
    ]
    # 2 saves per process per checkpoint (the part or nothing, and its rng_<i>): the 3rd is
    # process 0's part of checkpoint_1
    assert run_ranks("accel_run", "shardpoint", str(killed), "2", kill_rank0_at_save=3) == [-9, -9]
    # the kill landed where meant: checkpoint_0 committed, checkpoint_1's part not
    checkpoints = killed / "checkpoints"
    assert (checkpoints / "checkpoint_0/shardpoint.index").exists()
    assert not (checkpoints / "checkpoint_1/shardpoint.index").exists()
    resumed = run_ranks("accel_run", "shardpoint", str(killed), "2", "latest")
    for rank in (0, 1):
        (got,) = resumed[rank]
        ours = full[rank][0]
        per_epoch = len(ours["losses"]) // 2
        assert got["losses"] == ours["losses"][per_epoch:]
        assert got["digest"] == ours["digest"] and got["progress"] == ours["progress"]
    assert pickles_under(killed) == [] and pickles_under(ours_dir) == []
