"""DeepSpeed through ShardpointCheckpointEngine: ZeRO stages 1, 2 and 3 on the CPU (gloo, one
rank) — exact resume in a new process against the uninterrupted run and DeepSpeed's own
checkpoints, what is stored, a save killed mid-way (``latest`` still names the previous
checkpoint), a damaged checkpoint through ``load_checkpoint``, the object allow-list.
DeepSpeed runs in child processes (it needs a process group and its CPU communication op,
which it JIT-builds with ninja from the venv; the Makefile builds it once at install)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
from integration_helpers.common import (  # noqa: E402
    assert_same_tree,
    damage_value,
    pickles_under,
    run_child,
    run_child_killed,
)

ENV = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
MODEL = "global_step3/mp_rank_00_model_states.pt"
OPTIM = "global_step3/zero_pp_rank_0_mp_rank_00_optim_states.pt"
STAGES = ("1", "2", "3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("deepspeed")
    os.environ.update(ENV)
    jobs: list[str] = []
    names = []
    for stage in STAGES:
        for kind in ("shardpoint", "native"):
            jobs += ["train", kind, str(base / f"{kind}{stage}"), "6", stage, ";"]
            names.append(f"{kind}{stage}")
    results = run_child("ds_run", *jobs[:-1], env=ENV)
    return {"base": base, **dict(zip(names, results, strict=True))}


def test_resume_in_new_process_is_exact(runs: dict[str, Any], tmp_path: Path) -> None:
    base = runs["base"]
    # a save killed while writing global_step6's first file (saves: 2 files per checkpoint)
    proc = run_child_killed(
        "ds_run", "train", "shardpoint", str(tmp_path / "killed"), "6", "1", kill_at_save=3
    )
    assert proc.returncode == -9 and "SELFKILL mid-save" in proc.stdout, proc.stderr[-2000:]
    assert (tmp_path / "killed" / "latest").read_text() == "global_step3"
    jobs: list[str] = []
    for stage in STAGES:
        for kind in ("shardpoint", "native"):
            jobs += ["resume", kind, str(base / f"{kind}{stage}"), "6", stage, "global_step3", ";"]
    jobs += ["resume", "shardpoint", str(tmp_path / "killed"), "6", "1", "latest"]
    s1, n1, s2, n2, s3, n3, after_kill = run_child("ds_run", *jobs, env=ENV)
    for stage, ours, native in (("1", s1, n1), ("2", s2, n2), ("3", s3, n3)):
        full = runs[f"shardpoint{stage}"]
        assert full["losses"] == runs[f"native{stage}"]["losses"]
        assert ours["losses"] == full["losses"][3:] == native["losses"]
        assert ours["digest"] == full["digest"] == native["digest"]
    assert after_kill["losses"] == runs["shardpoint1"]["losses"][3:]
    assert after_kill["digest"] == runs["shardpoint1"]["digest"]
    for stage in STAGES:
        assert pickles_under(base / f"shardpoint{stage}") == []


def test_checkpoint_holds_what_deepspeed_saves(runs: dict[str, Any]) -> None:
    from shardpoint.integrations.deepspeed import decode_objects

    for stage in ("1", "2"):
        ours_dir = runs["base"] / f"shardpoint{stage}"
        nat_dir = runs["base"] / f"native{stage}"
        model = decode_objects(sptorch_load(ours_dir / MODEL / "state"))
        native = torch.load(nat_dir / MODEL, weights_only=False)
        assert sorted(model) == sorted(native)
        assert_same_tree(model["module"], native["module"])
        assert_same_tree(model["lr_scheduler"], native["lr_scheduler"])
        optim = decode_objects(sptorch_load(ours_dir / OPTIM / "state"))["optimizer_state_dict"]
        nat_optim = torch.load(nat_dir / OPTIM, weights_only=False)["optimizer_state_dict"]
        assert sorted(optim) == sorted(nat_optim)
        assert_same_tree(optim["base_optimizer_state"], nat_optim["base_optimizer_state"])
        assert_same_tree(
            optim["single_partition_of_fp32_groups"], nat_optim["single_partition_of_fp32_groups"]
        )
        assert optim["zero_stage"] == nat_optim["zero_stage"]
        assert type(optim["zero_stage"]) is type(nat_optim["zero_stage"])
        assert vars(optim["loss_scaler"]) == vars(nat_optim["loss_scaler"])
        assert optim["param_slice_mappings"] == nat_optim["param_slice_mappings"]


def sptorch_load(prefix: Path) -> Any:
    from shardpoint import torch as sptorch

    return sptorch.load(str(prefix))


def test_damaged_checkpoint_fails_clearly_through_load_checkpoint(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(runs["base"] / "shardpoint1", bad)
    damage_value(str(bad / MODEL / "state"), "module/0.weight")
    missing = tmp_path / "missing"
    shutil.copytree(runs["base"] / "shardpoint1", missing)
    (missing / OPTIM / "state.index").unlink()
    damaged, gone = run_child(
        "ds_run", "load", "shardpoint", str(bad), "1", "global_step3", ";",
        "load", "shardpoint", str(missing), "1", "global_step3", env=ENV,
    )  # fmt: skip
    assert damaged["error"] == "ChecksumMismatchError" and "module/0.weight" in damaged["message"]
    assert "NotFoundError" in gone["mro"] and "state.index' is missing" in gone["message"]


def test_objects_outside_the_allow_list_are_refused(tmp_path: Path) -> None:
    from shardpoint.integrations.deepspeed import (
        ShardpointCheckpointEngine,
        decode_objects,
        encode_objects,
    )

    engine = ShardpointCheckpointEngine()
    with pytest.raises(sp.UnsupportedDTypeError, match="client_state/obj"):
        engine.save({"client_state": {"obj": object()}}, str(tmp_path / "x.pt"))
    assert not sp.exists(str(tmp_path / "x.pt" / "state"))
    forged = {"a": {"__shardpoint_object__": "os.system", "value": "true"}}
    with pytest.raises(sp.CorruptCheckpointError, match="allow-list"):
        decode_objects(forged)
    assert decode_objects(encode_objects({"s": {"b", "a"}})) == {"s": {"a", "b"}}


def test_param_shapes_come_back_as_torch_size(tmp_path: Path) -> None:
    """DeepSpeed's ``param_shapes`` (per group, name -> ``torch.Size``) round trip with their
    type through the engine and through the consolidation's reads (ZeRO-3's merge calls
    ``shape.numel()``); plain tuples stay tuples."""
    from shardpoint.integrations.deepspeed import ShardpointCheckpointEngine
    from shardpoint.integrations.zero_to_fp32 import reading_shardpoint

    state = {
        "param_shapes": [{"0.weight": torch.Size([4, 3]), "0.bias": torch.Size([4])}],
        "pair": (1, torch.Size([2, 2])),
        "w": torch.ones(2),
    }
    path = str(tmp_path / "zero_pp_rank_0_mp_rank_00_model_states.pt")
    engine = ShardpointCheckpointEngine()
    engine.save(state, path)
    with reading_shardpoint() as ds:
        read = ds.torch.load(path, map_location="cpu")
    for got in (engine.load(path), read):
        shapes = got["param_shapes"][0]
        assert {k: type(v) for k, v in shapes.items()} == dict.fromkeys(shapes, torch.Size)
        assert shapes == state["param_shapes"][0] and shapes["0.weight"].numel() == 12
        assert type(got["pair"]) is tuple and type(got["pair"][1]) is torch.Size
        assert got["pair"] == state["pair"]


def test_background_saves_commit_at_the_next_step(runs: dict[str, Any], tmp_path: Path) -> None:
    """blocking=False: save_checkpoint returns after the snapshot; DeepSpeed commits (our
    commit waits for the writes) and moves ``latest`` at the next optimizer step."""
    (got,) = run_child("ds_run", "train", "shardpoint-async", str(tmp_path), "6", "1", env=ENV)
    assert got["losses"] == runs["shardpoint1"]["losses"]
    # global_step6 was written (and committed at exit) but no step followed it
    assert (tmp_path / "latest").read_text() == "global_step3"
    assert sp.exists(str(tmp_path / MODEL.replace("3", "6") / "state"))
    (resumed,) = run_child(
        "ds_run", "resume", "shardpoint", str(tmp_path), "6", "1", "global_step3", env=ENV
    )
    assert resumed["losses"] == runs["shardpoint1"]["losses"][3:]
    assert resumed["digest"] == runs["shardpoint1"]["digest"]
