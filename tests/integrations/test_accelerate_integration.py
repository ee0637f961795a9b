"""accelerate through ShardpointAccelerator: exact resume in a new process (dropout, shuffled
data, a register_for_checkpointing object) against the uninterrupted run and accelerate's own
save_state, what is stored (the weights files accelerate writes, the rest in shardpoint's
part), the compressed-weights knob, total_limit rotation, the pre-hooks, a save killed mid-way,
a damaged checkpoint. Real accelerate, CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
from integration_helpers import accel_run  # noqa: E402
from integration_helpers.common import (  # noqa: E402
    assert_same_tree,
    damage_safetensors,
    damage_value,
    pickles_under,
    run_child,
    run_child_killed,
)
from shardpoint.integrations import accelerate as spacc  # noqa: E402

CK0 = "checkpoints/checkpoint_0"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardpoint", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("accelerate")
    out: dict[str, Any] = {"base": base}
    for kind in ("shardpoint", "native"):
        out[kind] = accel_run.train(kind, str(base / kind), 2)
    return out


def test_resume_in_new_process_is_exact(runs: dict[str, Any]) -> None:
    ours, native = runs["shardpoint"], runs["native"]
    assert ours == native
    base = runs["base"]
    resumed, native_resumed = run_child(
        "accel_run",
        "shardpoint", str(base / "r-sp"), "2", str(base / "shardpoint" / CK0), ";",
        "native", str(base / "r-nat"), "2", str(base / "native" / CK0),
    )  # fmt: skip
    assert resumed["losses"] == ours["losses"][4:] == native_resumed["losses"]
    assert resumed["digest"] == ours["digest"] == native_resumed["digest"]
    assert resumed["progress"] == ours["progress"]
    assert pickles_under(base / "shardpoint") == [] and pickles_under(base / "r-sp") == []
    names = sorted(p.name for p in (base / "shardpoint" / CK0).iterdir())
    assert [n for n in names if ".data-" not in n] == ["model.safetensors", "shardpoint.index"]


def test_compressed_weights_knob(runs: dict[str, Any], tmp_path: Path) -> None:
    assert accel_run.train("shardpoint-compressed", str(tmp_path), 2) == runs["shardpoint"]
    assert not list(tmp_path.rglob("*.safetensors"))
    (resumed,) = run_child(
        "accel_run", "shardpoint-compressed", str(tmp_path / "r"), "2", str(tmp_path / CK0)
    )
    assert resumed["digest"] == runs["shardpoint"]["digest"]


def test_checkpoint_holds_what_accelerate_saves(runs: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    ours = spacc.load_checkpoint(runs["base"] / "shardpoint" / CK0)
    nat = runs["base"] / "native" / CK0
    assert_same_tree(ours["models"][0], load_file(nat / "model.safetensors"))
    mine = load_file(runs["base"] / "shardpoint" / CK0 / "model.safetensors")
    assert_same_tree(mine, load_file(nat / "model.safetensors"))
    assert_same_tree(ours["optimizers"][0], torch.load(nat / "optimizer.bin", weights_only=True))
    assert_same_tree(ours["schedulers"][0], torch.load(nat / "scheduler.bin", weights_only=True))
    assert_same_tree(
        ours["custom"][0], torch.load(nat / "custom_checkpoint_0.pkl", weights_only=False)
    )
    rng = torch.load(nat / "random_states_0.pkl", weights_only=False)
    assert tuple(int(v) for v in ours["rng"]["python"]["state"]) == rng["random_state"][1]
    assert_same_tree(ours["rng"]["cpu"], rng["torch_manual_seed"])
    assert ours["step"] == rng["step"]


def test_total_limit_rotation_and_hooks(tmp_path: Path) -> None:
    kept, got = {}, {}
    for kind in ("shardpoint", "shardpoint-async", "native"):
        got[kind] = accel_run.train(kind, str(tmp_path / kind), 3, total_limit=2)
        kept[kind] = sorted(os.listdir(tmp_path / kind / "checkpoints"))
    assert kept["shardpoint"] == kept["native"] == ["checkpoint_1", "checkpoint_2"]
    assert kept["shardpoint-async"] == kept["native"]
    assert got["shardpoint-async"] == got["shardpoint"] == got["native"]
    assert_same_tree(  # background saves hold what blocking ones hold
        spacc.load_checkpoint(tmp_path / "shardpoint-async" / "checkpoints/checkpoint_2"),
        spacc.load_checkpoint(tmp_path / "shardpoint" / "checkpoints/checkpoint_2"),
    )

    from accelerate.utils import ProjectConfiguration

    acc = spacc.ShardpointAccelerator(
        cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path / "h"))
    )
    model = acc.prepare(torch.nn.Linear(3, 2))
    seen: list[str] = []

    def on_save(models: list[Any], weights: list[Any], out: str) -> None:
        seen.append(f"save {len(models)} {sorted(weights[0])} {os.path.basename(out)}")

    def on_load(models: list[Any], src: str) -> None:
        seen.append(f"load {len(models)} {os.path.basename(src)}")
        models.pop()  # the hook takes this model over: not loaded by us

    acc.register_save_state_pre_hook(on_save)
    acc.register_load_state_pre_hook(on_load)
    acc.save_state(str(tmp_path / "h" / "ck"))
    with torch.no_grad():
        model.weight.add_(1.0)
    acc.load_state(str(tmp_path / "h" / "ck"))
    assert seen == ["save 1 ['bias', 'weight'] ck", "load 1 ck"]
    saved = spacc.load_checkpoint(tmp_path / "h" / "ck")["models"][0]["weight"]
    assert torch.equal(model.weight, saved + 1.0)  # the load hook took it over


def test_killed_save_resumes_from_the_previous_checkpoint(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    proc = run_child_killed("accel_run", "shardpoint", str(tmp_path), "2", kill_at_save=2)
    assert proc.returncode == -9 and "SELFKILL mid-save" in proc.stdout, proc.stderr[-2000:]
    assert (tmp_path / "checkpoints/checkpoint_1").is_dir()
    assert not sp.exists(str(tmp_path / "checkpoints/checkpoint_1/shardpoint"))
    (resumed,) = run_child("accel_run", "shardpoint", str(tmp_path), "2", "latest")
    assert resumed["losses"] == runs["shardpoint"]["losses"][4:]
    assert resumed["digest"] == runs["shardpoint"]["digest"]
    assert sp.exists(str(tmp_path / "checkpoints/checkpoint_1/shardpoint"))  # replaced


def test_damaged_checkpoint_fails_clearly_through_load_state(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(runs["base"] / "shardpoint" / CK0, bad)
    ok = _cli("verify", str(bad))
    assert ok.returncode == 0 and "accelerate" in ok.stdout, ok.stderr
    assert "weight tensors checked" in ok.stdout
    damage_safetensors(bad / "model.safetensors", "3.weight")
    failed = _cli("verify", str(bad))
    assert failed.returncode == 1 and "3.weight" in failed.stderr, failed.stderr
    with pytest.raises(sp.ChecksumMismatchError, match="3.weight"):
        accel_run.train("shardpoint", str(tmp_path / "run"), 2, resume=str(bad))
    shutil.copy(runs["base"] / "shardpoint" / CK0 / "model.safetensors", bad)
    damage_value(str(bad / "shardpoint"), "optimizers/0/state/0/exp_avg")
    with pytest.raises(sp.ChecksumMismatchError, match="exp_avg"):
        accel_run.train("shardpoint", str(tmp_path / "run"), 2, resume=str(bad))
    (bad / "shardpoint.index").unlink()
    with pytest.raises(sp.NotFoundError, match="shardpoint.index' is missing"):
        accel_run.train("shardpoint", str(tmp_path / "run"), 2, resume=str(bad))
