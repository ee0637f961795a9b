"""The Hugging Face Trainer with the tiers switched on by one argument
(``shardpoint_local_directory=``): a stopped job resumes in a new process, bit-exactly, from its
local tier, and from the persistent tier after the local tier was wiped. Real transformers, a
tiny GPT-2 from a config with dropout on, CPU (integration_helpers.hf_run, kind ``tiers``:
local every 2 steps, persistent every 4)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from integration_helpers import hf_run  # noqa: E402
from integration_helpers.common import run_child  # noqa: E402
from shardpoint.errors import InvalidArgumentError  # noqa: E402


def test_one_argument_resumes_exactly_from_local_then_persistent(tmp_path: Path) -> None:
    straight = hf_run.train("shardpoint", str(tmp_path / "straight"), 8, save_strategy="no")
    a, b = tmp_path / "a", tmp_path / "b"
    # the job stops after step 7 of 8: local saves at 2, 4, 6 (2 kept), persistent at 4
    (first,) = run_child("hf_run", "shardpoint-tiers", str(a), "8", env={"SP_TEST_STOP_AT": "7"})
    assert first["global_step"] == 7 and first["tier_step"] is None
    assert first["losses"] == straight["losses"][:7]
    own = a / "nvme" / "rank-00000" / "own"
    assert sorted(p.name for p in own.glob("*.tier-commit.json")) == [
        "ckpt-4.tier-commit.json",
        "ckpt-6.tier-commit.json",
    ]
    assert sorted(os.listdir(a / "tiers")) == ["ckpt-4"]
    assert not list(a.glob("checkpoint-*"))  # the Trainer's own saves are off in this run
    shutil.copytree(a, b)
    shutil.rmtree(b / "nvme")  # b: the node was replaced, its local tier is gone

    # train(resume_from_checkpoint=True) in new processes: step 6 from the local tier, step 4
    # from the persistent one; then exactly the uninterrupted run's steps
    local, persistent = run_child(
        "hf_run", "shardpoint-tiers", str(a), "8", "true", ";",
        "shardpoint-tiers", str(b), "8", "true",
    )  # fmt: skip
    assert local["tier_step"] == 6 and local["tiers"] == ["local"]
    assert local["losses"] == straight["losses"][6:]
    assert persistent["tier_step"] == 4 and persistent["tiers"] == ["persistent"]
    assert persistent["losses"] == straight["losses"][4:]
    assert local["digest"] == persistent["digest"] == straight["digest"]
    assert local["global_step"] == persistent["global_step"] == 8
    # the replaced node's local tier was refilled and saved into again
    refilled = b / "nvme" / "rank-00000" / "own"
    assert (refilled / "ckpt-8.tier-commit.json").exists()


def test_the_newer_of_the_tiers_and_the_trainer_checkpoints_is_resumed(tmp_path: Path) -> None:
    # the tiers' local copies of 4 and 6 beside the Trainer's checkpoint-3 and checkpoint-6
    out = tmp_path / "run"
    tiers = {"local_every": 2, "persistent_every": 100}
    hf_run.build("shardpoint-tiers", str(out), 6, {"shardpoint_tiers": tiers}).train()
    own = out / "nvme" / "rank-00000" / "own"
    for p in own.glob("ckpt-6.*"):
        p.unlink()
    # checkpoint-6 is newer than the tiers' step 4: resumed from it
    again = hf_run.build("shardpoint-tiers", str(out), 8, {"shardpoint_tiers": tiers})
    again.train(resume_from_checkpoint=True)
    assert again.shardpoint_tiers.restored_step is None and len(again.recorded) == 2
    shutil.rmtree(out / "checkpoint-6")
    shutil.rmtree(out / "checkpoint-8")
    for p in own.glob("ckpt-[68].*"):
        p.unlink()
    # now the tiers' step 4 is newer than checkpoint-3
    last = hf_run.build("shardpoint-tiers", str(out), 8, {"shardpoint_tiers": tiers})
    last.train(resume_from_checkpoint=True)
    assert last.shardpoint_tiers.restored_step == 4 and len(last.recorded) == 4
    assert last.state.global_step == 8


def test_tier_options_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="needs shardpoint_local_directory"):
        hf_run.build("shardpoint", "/nonexistent", 1, {"shardpoint_tiers": {"local_every": 2}})
    bad = {"shardpoint_local_directory": "/nonexistent/nvme", "shardpoint_tiers": {"every": 2}}
    with pytest.raises(InvalidArgumentError, match="unknown tier options \\['every'\\]"):
        hf_run.build("shardpoint", "/nonexistent", 1, bad)
