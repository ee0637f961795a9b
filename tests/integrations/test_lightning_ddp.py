"""Lightning on 2 real CPU processes (gloo) with ShardpointCheckpointIO, ``strategy="ddp"``
(Lightning re-launches the script for rank 1) and ``"ddp_spawn"`` (the plugin is pickled to
spawned workers): the job is SIGKILLed while rank 0 writes a checkpoint, then resumes from
``last`` in new processes and ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
from integration_helpers.common import TESTS  # noqa: E402
from rank_rendezvous import rendezvous_env  # noqa: E402
from shardpoint.integrations.lightning import load_checkpoint  # noqa: E402


def run(
    strategy: str, root: Path, *extra: str, kill_at_save: int = 0
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    env["SP_TEST_KILL_AT_SAVE"] = str(kill_at_save)
    # Lightning's ranks (ddp: rank 0 and the rank 1 it starts; ddp_spawn: its workers) meet
    # at a store served here (rank_rendezvous), not at a port Lightning picks free
    with rendezvous_env() as rendezvous:
        env.update(rendezvous)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "integration_helpers.lightning_ddp",
                strategy,
                str(root),
                "2",
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            start_new_session=True,  # the kill takes the whole process group, as a preemption does
        )


def result(proc: subprocess.CompletedProcess) -> dict[str, object]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted run (ddp; ddp_spawn computes the same steps in the same order)."""
    return result(run("ddp", tmp_path_factory.mktemp("straight")))


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_processes_killed_mid_save_resume_exactly(
    strategy: str, straight: dict[str, object], tmp_path: Path
) -> None:
    # rank 0's saves: epoch 0 (1), last (2), epoch 1 (3: killed while its data is written)
    killed = run(strategy, tmp_path, kill_at_save=3)
    assert killed.returncode == -9 and "SELFKILL mid-save" in killed.stdout, killed.stderr[-3000:]
    ckpts = tmp_path / "ckpts"
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert load_checkpoint(ckpts / "last.ckpt")["global_step"] == 2  # 2 ranks: 2 steps/epoch
    resumed = result(run(strategy, tmp_path, "last"))
    assert resumed["digest"] == straight["digest"]
    for name in ("epoch=1-step=4.ckpt", "last.ckpt"):
        assert sp.open(str(ckpts / name)).metadata == {"shardpoint.integration": "lightning"}
    assert load_checkpoint(ckpts / "last.ckpt")["global_step"] == 4
