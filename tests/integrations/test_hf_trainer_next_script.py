"""A plain transformers ``Trainer`` resuming from a ``ShardpointTrainer`` checkpoint, in a fresh
process whose script never names shardpoint: ``trainer.train(resume_from_checkpoint=
"checkpoint-3")`` and ``resume_from_checkpoint=True``. Before the front
(``_shardpoint_loaders/trainer_resume.py``) the Trainer found no ``optimizer.pt``,
``scheduler.pt`` or ``rng_state.pth`` and went on silently with a fresh optimizer, a restarted
schedule and other random draws: other losses, other weights, no error. Now the resumed run
matches the uninterrupted one exactly (losses as hex floats, a digest of the final weights),
with the weights as safetensors and compressed in the part; with the reading turned off the
resume fails naming shardpoint. Real transformers, a tiny GPT-2 with dropout, CPU."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from integration_helpers import hf_run  # noqa: E402
from integration_helpers.common import run_child  # noqa: E402


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("hf_next")
    out: dict[str, Any] = {"base": base}
    for kind in ("shardpoint", "shardpoint-compressed", "native"):
        out[kind] = hf_run.train(kind, str(base / kind), 6)
    assert out["shardpoint"]["losses"] == out["native"]["losses"]
    return out


@pytest.mark.parametrize("kind", ["shardpoint", "shardpoint-compressed"])
def test_a_plain_trainer_resumes_a_shardpoint_checkpoint_exactly(
    uninterrupted: dict[str, Any], kind: str, tmp_path: Path
) -> None:
    base = uninterrupted["base"]
    ck = base / kind / "checkpoint-3"
    assert not (ck / "optimizer.pt").exists() and not (ck / "rng_state.pth").exists()
    # `True`: the newest checkpoint-N of the output directory, as Trainer finds it
    latest = tmp_path / "latest"
    shutil.copytree(ck, latest / "checkpoint-3")
    by_path, by_latest = run_child(
        "hf_run", "native", str(tmp_path / "r"), "6", str(ck), ";",
        "native", str(latest), "6", "true",
    )  # fmt: skip
    want = uninterrupted[kind]
    for got in (by_path, by_latest):
        assert got["losses"] == want["losses"][3:]
        assert got["digest"] == want["digest"] == uninterrupted["native"]["digest"]
        assert got["global_step"] == 6


def test_native_checkpoints_stay_the_trainers_own(uninterrupted: dict[str, Any]) -> None:
    """Trainer's own checkpoint: its files, read by its own code (the front steps aside)."""
    base = uninterrupted["base"]
    (got,) = run_child(
        "hf_run", "native", str(base / "native-r"), "6", str(base / "native/checkpoint-3")
    )
    assert got["losses"] == uninterrupted["native"]["losses"][3:]
    assert got["digest"] == uninterrupted["native"]["digest"]


def test_reading_turned_off_fails_instead_of_resuming_silently_wrong(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    ck = uninterrupted["base"] / "shardpoint" / "checkpoint-3"
    with pytest.raises(AssertionError) as err:
        run_child(
            "hf_run", "native", str(tmp_path / "r"), "6", str(ck),
            env={"SHARDPOINT_TORCH_LOAD": "0"},
        )  # fmt: skip
    last = str(err.value).strip().splitlines()[-1]
    assert last.startswith("ValueError") and "ShardpointTrainer" in last
    assert "optimizer and scheduler states are in shardpoint.index" in last
