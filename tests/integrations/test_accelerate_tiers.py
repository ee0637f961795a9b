"""accelerate with the tiers switched on by one argument (``shardpoint_local_directory=``):
``save_state()`` every epoch goes to the tiers, and ``load_state()`` in a new process resumes
bit-exactly from the local tier, and from the persistent tier after the local tier was wiped.
Real accelerate on CPU, a tiny model with dropout, shuffled data, AdamW + StepLR and a
registered object (integration_helpers.accel_run, kind ``shardpoint-tiers``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

from integration_helpers import accel_run  # noqa: E402
from integration_helpers.common import run_child  # noqa: E402
from shardpoint.errors import InvalidArgumentError  # noqa: E402


def test_one_argument_resumes_exactly_from_local_then_persistent(tmp_path: Path) -> None:
    straight = accel_run.train("shardpoint", str(tmp_path / "straight"), 4)
    a, b = tmp_path / "a", tmp_path / "b"
    # 3 epochs of 4 steps: local saves at 1, 2, 3 (the 2 newest kept), persistent at 2
    first = accel_run.train("shardpoint-tiers", str(a), 3)
    assert first["losses"] == straight["losses"][:12] and first["tier_step"] is None
    own = a / "nvme" / "rank-00000" / "own"
    assert sorted(p.name for p in own.glob("*.tier-commit.json")) == [
        "ckpt-2.tier-commit.json",
        "ckpt-3.tier-commit.json",
    ]
    assert (a / "tiers" / "ckpt-2" / "tier-commit.json").exists()
    assert not (a / "checkpoints").exists()  # save_state() without a directory: tiers only
    shutil.copytree(a, b)
    shutil.rmtree(b / "nvme")

    local, persistent = run_child(
        "accel_run", "shardpoint-tiers", str(a), "4", "latest", ";",
        "shardpoint-tiers", str(b), "4", "latest",
    )  # fmt: skip
    assert local["tier_step"] == 3 and local["tiers"] == ["local"]
    assert local["losses"] == straight["losses"][12:]
    assert persistent["tier_step"] == 2 and persistent["tiers"] == ["persistent"]
    assert persistent["losses"] == straight["losses"][8:]
    for run in (local, persistent):
        assert run["digest"] == straight["digest"]
        assert run["progress"] == straight["progress"] and run["step"] == straight["step"]


def test_nothing_saved_yet_is_a_fresh_start(tmp_path: Path) -> None:
    from accelerate.utils import ProjectConfiguration

    from shardpoint.integrations.accelerate import ShardpointAccelerator

    acc = ShardpointAccelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=str(tmp_path)),
        shardpoint_local_directory=tmp_path / "nvme",
    )
    try:
        assert acc.load_state() is None and acc.shardpoint_tiers.restored_step is None
    finally:
        acc.end_training()
    with pytest.raises(InvalidArgumentError, match="unknown tier options"):
        ShardpointAccelerator(cpu=True, shardpoint_local_directory="x", shardpoint_tiers={"k": 1})
