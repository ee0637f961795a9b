"""Lightning with the tiers switched on by one callback (``ShardpointTiers``): a run resumes
by itself, exactly, from its local tier, and from the persistent tier after the local tier was
wiped. Real Lightning on CPU, a tiny module (integration_helpers.lightning_run)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

import lightning.pytorch as pl  # noqa: E402

from integration_helpers import lightning_run  # noqa: E402
from integration_helpers.common import digest, hexes  # noqa: E402
from shardpoint.integrations.lightning import ShardpointTiers  # noqa: E402


def _fit(
    root: Path, epochs: int, tiers: ShardpointTiers | None, accumulate: int = 1
) -> dict[str, Any]:
    model = lightning_run.make_module()
    seen: dict[str, Any] = {}

    class Probe(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            seen["start_step"] = trainer.global_step

    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[Probe()] + ([tiers] if tiers is not None else []),
        default_root_dir=str(root),
        deterministic=True,
        accumulate_grad_batches=accumulate,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, lightning_run.loader())
    return {
        "losses": hexes(model.losses),
        "digest": digest(model.state_dict()),
        "start": seen["start_step"],
        "step": trainer.global_step,
    }


def _tiers(root: Path) -> ShardpointTiers:
    # 4 optimizer steps per epoch: a local save every epoch, a persistent one every 2
    return ShardpointTiers(
        root / "bucket", local_directory=root / "nvme", local_every=4, persistent_every=8
    )


def test_one_callback_resumes_exactly_from_local_then_from_persistent(tmp_path: Path) -> None:
    straight = _fit(tmp_path / "straight", 4, None)  # 16 steps, never interrupted
    assert straight["step"] == 16

    a, b = tmp_path / "a", tmp_path / "b"
    first = _tiers(a)
    run = _fit(a, 3, first)  # 12 steps: local tier at 4, 8, 12; persistent at 8
    assert first.restored_step is None and run["step"] == 12
    assert run["losses"] == straight["losses"][:12]
    assert (a / "bucket" / "ckpt-8" / "tier-commit.json").exists()
    assert not (a / "bucket" / "ckpt-12").exists()
    shutil.copytree(a, b)

    # a restarted job: step 12 from the local tier, then exactly the uninterrupted run's steps
    resumed = _tiers(a)
    run = _fit(a, 4, resumed)
    assert resumed.restored_step == 12 and run["start"] == 12 and run["step"] == 16
    assert run["losses"] == straight["losses"][12:]
    assert run["digest"] == straight["digest"]

    # the node replaced: its local tier is gone; step 8 comes from the persistent tier
    shutil.rmtree(b / "nvme")
    again = _tiers(b)
    run = _fit(b, 4, again)
    assert again.restored_step == 8 and run["start"] == 8
    assert again.manager is None  # closed at teardown
    assert run["losses"] == straight["losses"][8:]
    assert run["digest"] == straight["digest"]
    # the local tier was refilled from the persistent copy, and saved into again
    own = b / "nvme" / "rank-00000" / "own"
    assert (own / "ckpt-16.tier-commit.json").exists()


def test_saves_follow_optimizer_steps_under_gradient_accumulation(tmp_path: Path) -> None:
    tiers = ShardpointTiers(
        tmp_path / "bucket", local_directory=tmp_path / "nvme", local_every=1, local_max_to_keep=5
    )
    run = _fit(tmp_path, 1, tiers, accumulate=2)  # 4 batches, 2 optimizer steps
    assert run["step"] == 2
    own = tmp_path / "nvme" / "rank-00000" / "own"
    # one save per optimizer step, none for the batches before the first one (step 0)
    assert sorted(p.name for p in own.glob("*.tier-commit.json")) == [
        "ckpt-1.tier-commit.json",
        "ckpt-2.tier-commit.json",
    ]
