"""Hugging Face Trainer through ShardpointTrainer: exact resume in a new process (dropout on,
mid-epoch) against the uninterrupted run and Trainer's own checkpoints, what is stored,
save_total_limit + load_best_model_at_end, from_pretrained, a save killed mid-way, a damaged
checkpoint. Real transformers, a tiny GPT-2 from a config, CPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
from integration_helpers import hf_run  # noqa: E402
from integration_helpers.common import (  # noqa: E402
    assert_same_tree,
    damage_value,
    digest,
    pickles_under,
    run_child,
    run_child_killed,
)
from shardpoint.integrations import hf_trainer  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("hf")
    out: dict[str, Any] = {"base": base}
    for kind in ("shardpoint", "native"):
        out[kind] = hf_run.train(kind, str(base / kind), 6)
    return out


def test_resume_in_new_process_is_exact(runs: dict[str, Any]) -> None:
    ours, native = runs["shardpoint"], runs["native"]
    assert ours["losses"] == native["losses"] and ours["digest"] == native["digest"]
    base = runs["base"]
    resumed, native_resumed = run_child(
        "hf_run",
        "shardpoint", str(base / "shardpoint"), "6", str(base / "shardpoint/checkpoint-3"), ";",
        "native", str(base / "native"), "6", str(base / "native/checkpoint-3"),
    )  # fmt: skip
    assert resumed["losses"] == ours["losses"][3:] == native_resumed["losses"]
    assert resumed["digest"] == ours["digest"] == native_resumed["digest"]
    assert pickles_under(base / "shardpoint") == []
    assert not list((base / "shardpoint").rglob("*.safetensors"))


def test_checkpoint_holds_what_trainer_saves(runs: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    ours = hf_trainer.load_checkpoint(runs["base"] / "shardpoint/checkpoint-3")
    nat = runs["base"] / "native/checkpoint-3"
    assert set(ours) == {"model", "optimizer", "scheduler", "rng"}
    model = dict(ours["model"])
    assert torch.equal(model["lm_head.weight"], model["transformer.wte.weight"])  # tied
    model.pop("lm_head.weight")  # save_pretrained drops the tied copy
    assert_same_tree(model, load_file(nat / "model.safetensors"))
    assert_same_tree(ours["optimizer"], torch.load(nat / "optimizer.pt", weights_only=True))
    assert_same_tree(ours["scheduler"], torch.load(nat / "scheduler.pt", weights_only=True))
    rng = torch.load(nat / "rng_state.pth", weights_only=False)
    assert tuple(int(x) for x in ours["rng"]["python"]["state"]) == rng["python"][1]
    assert_same_tree(ours["rng"]["cpu"], rng["cpu"])
    assert (ours["rng"]["numpy"]["keys"] == rng["numpy"][1]).all()
    mine = runs["base"] / "shardpoint/checkpoint-3"
    assert (mine / "trainer_state.json").read_text() == (nat / "trainer_state.json").read_text()


def test_from_pretrained_and_export(runs: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel

    ckpt = runs["base"] / "shardpoint/checkpoint-6"
    model = hf_trainer.from_pretrained(GPT2LMHeadModel, ckpt)
    assert digest(model.state_dict()) == runs["shardpoint"]["digest"]
    auto = hf_trainer.from_pretrained(AutoModelForCausalLM, ckpt)
    assert digest(auto.state_dict()) == runs["shardpoint"]["digest"]
    hf_trainer.export_pretrained(ckpt, tmp_path / "hf")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert digest(plain.state_dict()) == runs["shardpoint"]["digest"]


def test_async_saves_are_exact(runs: dict[str, Any], tmp_path: Path) -> None:
    got = hf_run.train("shardpoint-async", str(tmp_path), 6)
    assert got["losses"] == runs["shardpoint"]["losses"]
    assert_same_tree(
        hf_trainer.load_checkpoint(tmp_path / "checkpoint-3")["optimizer"],
        hf_trainer.load_checkpoint(runs["base"] / "shardpoint/checkpoint-3")["optimizer"],
    )


def test_best_model_and_total_limit_match_native(tmp_path: Path) -> None:
    extra = dict(
        eval_strategy="steps",
        eval_steps=3,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        save_total_limit=1,
    )
    got = {}
    for kind in ("shardpoint", "native"):
        trainer = hf_run.build(kind, str(tmp_path / kind), 9, **extra)
        trainer.train()
        got[kind] = (
            os.path.basename(trainer.state.best_model_checkpoint),
            sorted(os.listdir(tmp_path / kind)),
            digest(trainer.model.state_dict()),
        )
    assert got["shardpoint"] == got["native"]
    best, kept, final = got["shardpoint"]
    assert len(kept) <= 2 and best in kept  # rotation kept the best one
    best_model = hf_trainer.from_pretrained(
        __import__("transformers").GPT2LMHeadModel, tmp_path / "shardpoint" / best
    )
    assert digest(best_model.state_dict()) == final  # the best model was loaded at the end


def test_killed_save_resumes_from_the_previous_checkpoint(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    proc = run_child_killed("hf_run", "shardpoint", str(tmp_path), "6", kill_at_save=2)
    assert proc.returncode == -9 and "SELFKILL mid-save" in proc.stdout, proc.stderr[-2000:]
    assert (tmp_path / "checkpoint-6").is_dir()  # left incomplete: no index
    assert not sp.exists(str(tmp_path / "checkpoint-6/shardpoint"))
    assert hf_trainer.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    (resumed,) = run_child("hf_run", "shardpoint", str(tmp_path), "6", "true")
    assert resumed["losses"] == runs["shardpoint"]["losses"][3:]
    assert resumed["digest"] == runs["shardpoint"]["digest"]


def test_damaged_checkpoint_fails_clearly_through_train(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "checkpoint-3"
    shutil.copytree(runs["base"] / "shardpoint/checkpoint-3", bad)
    damage_value(str(bad / "shardpoint"), "model/transformer.h.0.attn.c_attn.weight")
    trainer = hf_run.build("shardpoint", str(tmp_path / "run"), 6)
    with pytest.raises(sp.ChecksumMismatchError, match="c_attn.weight"):
        trainer.train(resume_from_checkpoint=str(bad))
    (bad / "shardpoint.index").unlink()
    with pytest.raises(sp.NotFoundError, match="shardpoint.index is missing"):
        trainer.train(resume_from_checkpoint=str(bad))
