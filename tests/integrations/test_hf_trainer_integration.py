"""Hugging Face Trainer through ShardpointTrainer: exact resume in a new process (dropout on,
mid-epoch) against the uninterrupted run and Trainer's own checkpoints, what is stored (the
model directory the Trainer writes, the rest in shardpoint's part), the readers of a model
directory (from_pretrained, safetensors, a vLLM-style iterator, PEFT), sharded weights, the
compressed-weights knob, save_total_limit + load_best_model_at_end, a save killed mid-way, a
damaged checkpoint. Real transformers and PEFT, a tiny GPT-2 from a config, CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
from integration_helpers import hf_run  # noqa: E402
from integration_helpers.common import (  # noqa: E402
    assert_same_tree,
    damage_safetensors,
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
    mine = sorted(p.name for p in (base / "shardpoint/checkpoint-3").iterdir())
    assert [n for n in mine if not n.startswith("shardpoint.data-")] == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "optimizer.pt",
        "rng_state.pth",
        "scheduler.pt",
        "shardpoint.index",
        "trainer_state.json",
        "training_args.bin",
        "training_args.json",
    ]
    # the files Trainer names are ours, and torch.load (the front) reads them
    native = sorted(p.name for p in (base / "native/checkpoint-3").iterdir())
    assert set(native) - set(mine) == set()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardpoint", *args], capture_output=True, text=True, timeout=300
    )


def test_checkpoint_holds_what_trainer_saves(runs: dict[str, Any]) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    ours = hf_trainer.load_checkpoint(runs["base"] / "shardpoint/checkpoint-3")
    nat = runs["base"] / "native/checkpoint-3"
    mine = runs["base"] / "shardpoint/checkpoint-3"
    assert set(ours) == {"model", "optimizer", "scheduler", "rng"}
    # the weights file as save_pretrained writes it: same tensors (the tied lm_head.weight
    # dropped), same metadata; the part holds no model entry
    assert "lm_head.weight" not in ours["model"]
    assert_same_tree(ours["model"], load_file(nat / "model.safetensors"))
    assert_same_tree(load_file(mine / "model.safetensors"), load_file(nat / "model.safetensors"))
    with (
        safe_open(mine / "model.safetensors", "pt") as a,
        safe_open(nat / "model.safetensors", "pt") as b,
    ):
        assert a.metadata() == b.metadata() == {"format": "pt"}
    with sp.open(str(mine / "shardpoint")) as r:
        assert not r.prefix("model/")
    assert json.loads((mine / "config.json").read_text()) == json.loads(
        (nat / "config.json").read_text()
    )
    assert_same_tree(ours["optimizer"], torch.load(nat / "optimizer.pt", weights_only=True))
    assert_same_tree(ours["scheduler"], torch.load(nat / "scheduler.pt", weights_only=True))
    rng = torch.load(nat / "rng_state.pth", weights_only=False)
    assert ours["rng"]["python"] == rng["python"]  # Trainer's own structure, tuples and all
    assert_same_tree(ours["rng"]["cpu"], rng["cpu"])
    assert ours["rng"]["numpy"][0] == rng["numpy"][0]
    assert (ours["rng"]["numpy"][1] == rng["numpy"][1]).all()
    assert ours["rng"]["numpy"][2:] == rng["numpy"][2:]
    # each file read by torch.load itself (the front), equal to Trainer's pickle
    for name in ("optimizer.pt", "scheduler.pt"):
        assert_same_tree(
            torch.load(mine / name, weights_only=True), torch.load(nat / name, weights_only=True)
        )
    # the TrainingArguments object Trainer pickles there (built again from its fields)
    args = torch.load(mine / "training_args.bin", weights_only=False)
    assert type(args) is type(torch.load(nat / "training_args.bin", weights_only=False))
    assert json.loads(args.to_json_string()) == json.loads(
        (mine / "training_args.json").read_text()
    )
    assert (mine / "trainer_state.json").read_text() == (nat / "trainer_state.json").read_text()


def test_checkpoint_is_a_model_directory(runs: dict[str, Any]) -> None:
    """What reads a Hugging Face model directory reads the checkpoint, unchanged."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ckpt = runs["base"] / "shardpoint/checkpoint-6"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert digest(model.state_dict()) == runs["shardpoint"]["digest"]
    weights = load_file(ckpt / "model.safetensors")
    assert (
        digest({**weights, "lm_head.weight": weights["transformer.wte.weight"]})
        == (runs["shardpoint"]["digest"])
    )
    # vLLM's safetensors_weights_iterator: every *.safetensors file, every key, safe_open
    streamed = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(f, framework="pt") as st:
            streamed.update({k: st.get_tensor(k) for k in st.keys()})  # noqa: SIM118
    assert_same_tree(streamed, weights)


def test_verify_checks_the_weights_too(runs: dict[str, Any], tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-3"
    shutil.copytree(runs["base"] / "shardpoint/checkpoint-3", ckpt)
    ok = _cli("verify", str(ckpt))
    assert ok.returncode == 0, ok.stderr
    assert "hf_trainer" in ok.stdout and "weight tensors checked" in ok.stdout
    assert "optimizer.pt: hf_trainer" in ok.stdout and "rng_state.pth" in ok.stdout
    shutil.copy(ckpt / "optimizer.pt", tmp_path / "optimizer.pt")
    damage_value(str(ckpt / "optimizer.pt"), "state/0/exp_avg")
    bad = _cli("verify", str(ckpt))
    assert bad.returncode == 1 and "optimizer.pt" in bad.stderr and "exp_avg" in bad.stderr
    shutil.copy(tmp_path / "optimizer.pt", ckpt / "optimizer.pt")
    damage_safetensors(ckpt / "model.safetensors", "transformer.h.1.mlp.c_fc.weight")
    bad = _cli("verify", str(ckpt))
    assert bad.returncode == 1 and "transformer.h.1.mlp.c_fc.weight" in bad.stderr, bad.stderr
    index = ckpt / "shardpoint.index"
    index.write_bytes(index.read_bytes()[:-9])  # a damaged part index is reported, not skipped
    assert _cli("verify", str(ckpt)).returncode == 1


def test_a_damaged_weights_file_is_refused_by_the_next_scripts_from_pretrained(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    # transformers reads model.safetensors itself and checks nothing; shardpoint.index records
    # each weight's crc32c, and the from_pretrained front checks them first: a flipped bit is an
    # error naming the file and tensor, never a silently different model (found by a helper)
    # one next script (a fresh process) loads the intact copy, then the damaged one
    good, ckpt = tmp_path / "good/checkpoint-3", tmp_path / "checkpoint-3"
    for d in (good, ckpt):
        shutil.copytree(runs["base"] / "shardpoint/checkpoint-3", d)
    damage_safetensors(ckpt / "model.safetensors", "transformer.h.1.mlp.c_fc.weight")
    code = (
        "import sys, transformers as t\n"
        "t.AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print('intact copy loaded', flush=True)\n"
        "t.AutoModelForCausalLM.from_pretrained(sys.argv[2])"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    bad = subprocess.run(
        [sys.executable, "-c", code, str(good), str(ckpt)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert bad.stdout.strip() == "intact copy loaded", bad.stderr  # the intact one loads
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 1 and "ChecksumMismatchError" in last, bad.stderr
    assert "model.safetensors" in last and "transformer.h.1.mlp.c_fc.weight" in last


def test_a_native_optimizer_file_in_our_checkpoint_is_read_not_skipped(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """Trainer's own optimizer.pt / scheduler.pt copied over ours (a hand-mended directory):
    read as Trainer reads them, so the resume is still the uninterrupted run."""
    ck = tmp_path / "checkpoint-3"
    shutil.copytree(runs["base"] / "shardpoint/checkpoint-3", ck)
    for name in ("optimizer.pt", "scheduler.pt"):
        shutil.copy(runs["base"] / "native/checkpoint-3" / name, ck / name)
        assert (ck / name).read_bytes()[:8] != b"SPSINGLE"
    (resumed,) = run_child("hf_run", "shardpoint", str(tmp_path / "r"), "6", str(ck))
    assert resumed["losses"] == runs["shardpoint"]["losses"][3:]
    assert resumed["digest"] == runs["shardpoint"]["digest"]


def test_sharded_weights_as_save_pretrained_shards(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = hf_run.build("shardpoint-sharded", str(tmp_path / "run"), 3)
    trainer.train()
    got = digest(trainer.model.state_dict())
    ckpt = tmp_path / "run/checkpoint-3"
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert digest(model.state_dict()) == got
    trainer.model.save_pretrained(tmp_path / "hf", max_shard_size=hf_run.SHARD_BYTES)
    theirs = json.loads((tmp_path / "hf/model.safetensors.index.json").read_text())
    assert index["weight_map"] == theirs["weight_map"]
    assert len(set(index["weight_map"].values())) > 1
    assert index["metadata"]["total_size"] == theirs["metadata"]["total_size"]
    # resume from the sharded checkpoint (tensors checked against their crc32c) is exact
    resumed = hf_run.train("shardpoint-sharded", str(tmp_path / "run"), 3, str(ckpt))
    assert resumed["digest"] == got


def test_compressed_weights_knob(runs: dict[str, Any], tmp_path: Path) -> None:
    got = hf_run.train("shardpoint-compressed", str(tmp_path), 6)
    assert got["losses"] == runs["shardpoint"]["losses"]
    assert not list(tmp_path.rglob("*.safetensors"))
    with sp.open(str(tmp_path / "checkpoint-3/shardpoint")) as r:
        assert r.prefix("model/transformer.wte.weight")
    (resumed,) = run_child(
        "hf_run", "shardpoint-compressed", str(tmp_path), "6", str(tmp_path / "checkpoint-3")
    )
    assert resumed["losses"] == runs["shardpoint"]["losses"][3:]
    assert resumed["digest"] == runs["shardpoint"]["digest"]
    # the next script: transformers' own from_pretrained reads the directory (the front the
    # startup file installs), each weight equal to the one stored and checked on the way
    stored = {}
    with sp.open(str(tmp_path / "checkpoint-3/shardpoint"), framework="pt") as r:
        for key in r.keys():
            if key.startswith("model/"):
                stored[key[len("model/") :]] = r[key].numpy().tobytes().hex()
    code = (
        "import json, sys, transformers\n"
        "for cls in (transformers.AutoModelForCausalLM, transformers.GPT2LMHeadModel):\n"
        "    m = cls.from_pretrained(sys.argv[1])\n"
        "    print(json.dumps({k: v.numpy().tobytes().hex() for k, v in m.state_dict().items()}))\n"
        # accelerate's big-model loading of the same directory (its front, the same file)
        "import accelerate\n"
        "cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])\n"
        "with accelerate.init_empty_weights():\n"
        "    m = transformers.AutoModelForCausalLM.from_config(cfg)\n"
        "m = accelerate.load_checkpoint_and_dispatch(m, sys.argv[1], device_map='auto')\n"
        "print(json.dumps({k: v.numpy().tobytes().hex() for k, v in m.state_dict().items()}))\n"
        # transformers' own keywords through the auto class (they broke from_config before)
        "A = transformers.AutoModelForCausalLM\n"
        "for kw in ({'dtype': 'auto'}, {'torch_dtype': 'auto'}, {'device_map': 'cpu'},\n"
        "           {'output_loading_info': True}, {'output_hidden_states': True}):\n"
        "    m = A.from_pretrained(sys.argv[1], **kw)\n"
        "    m = m[0] if isinstance(m, tuple) else m\n"
        "    print(json.dumps({k: v.numpy().tobytes().hex() for k, v in m.state_dict().items()}))\n"
        "p = transformers.pipeline('text-generation', model=sys.argv[1], device='cpu')\n"
        "print(json.dumps({k: v.numpy().tobytes().hex() for k, v in p.model.state_dict().items()}))\n"
        # the base model from a checkpoint with a head: transformers drops the prefix
        "m = transformers.AutoModel.from_pretrained(sys.argv[1])\n"
        "print(type(m).__name__, json.dumps({k: v.numpy().tobytes().hex() for k, v in m.state_dict().items()}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "checkpoint-3")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    for line in lines[-10:-1]:
        loaded = json.loads(line)
        assert stored and all(loaded[k] == v for k, v in stored.items())
        assert loaded["lm_head.weight"] == loaded["transformer.wte.weight"]  # tied, stored once
    name, base = lines[-1].split(" ", 1)
    base_model = json.loads(base)
    assert name == "GPT2Model" and base_model
    assert all(v == stored["transformer." + k] for k, v in base_model.items())
    # the same directory with its index cut short (a full disk, a copy that stopped): the
    # error names shardpoint's damaged file, not "no file named model.safetensors". One next
    # script tries both: the first error printed as Python prints its last line, the second
    # left uncaught (exit 1)
    damaged = [tmp_path / f"damaged-{size}" for size in (0, 3)]
    for size, d in zip((0, 3), damaged, strict=True):
        shutil.copytree(tmp_path / "checkpoint-3", d)
        with open(d / "shardpoint.index", "r+b") as f:
            f.truncate(size)
    p = subprocess.run(
        [sys.executable, "-c", "import sys, traceback, transformers as t\n"
         "try:\n"
         "    t.AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
         "    print('LOADED')\n"
         "except Exception as e:\n"
         "    print(traceback.format_exception_only(e)[-1].strip(), flush=True)\n"
         "t.AutoModelForCausalLM.from_pretrained(sys.argv[2])",
         *map(str, damaged)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    first = p.stdout.strip().splitlines()[-1]
    assert "shardpoint.index" in first and "model.safetensors" not in first, first  # size 0
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "shardpoint.index" in last and "model.safetensors" not in last, last  # size 3


@pytest.fixture(scope="module")
def peft_native(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """PEFT's own run (a plain Trainer), the reference of both PEFT tests (read only)."""
    out = tmp_path_factory.mktemp("peft") / "native"
    return out, hf_run.train("peft-native", str(out), 6)


def test_peft_adapters_as_peft_writes_them(
    peft_native: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    native_dir, native = peft_native
    ours = hf_run.train("peft-shardpoint", str(tmp_path / "ours"), 6)
    assert ours["losses"] == native["losses"] and ours["digest"] == native["digest"]
    mine, nat = tmp_path / "ours/checkpoint-3", native_dir / "checkpoint-3"
    assert not (mine / "model.safetensors").exists()
    assert_same_tree(
        load_file(mine / "adapter_model.safetensors"), load_file(nat / "adapter_model.safetensors")
    )
    assert json.loads((mine / "adapter_config.json").read_text()) == json.loads(
        (nat / "adapter_config.json").read_text()
    )
    loaded = PeftModel.from_pretrained(hf_run.make_model(), mine)
    reference = PeftModel.from_pretrained(hf_run.make_model(), nat)
    assert digest(loaded.state_dict()) == digest(reference.state_dict())
    resumed = hf_run.train("peft-shardpoint", str(tmp_path / "ours"), 6, str(mine))
    assert resumed["losses"] == ours["losses"][3:] and resumed["digest"] == ours["digest"]
    assert pickles_under(tmp_path / "ours") == []
    # the adapter's tensors are checked against their crc32c on resume and by verify
    key = next(iter(load_file(mine / "adapter_model.safetensors")))
    damage_safetensors(mine / "adapter_model.safetensors", key)
    with pytest.raises(sp.ChecksumMismatchError, match=key):
        hf_run.train("peft-shardpoint", str(tmp_path / "ours"), 6, str(mine))
    bad = _cli("verify", str(mine))
    assert bad.returncode == 1 and key in bad.stderr, bad.stderr


def test_compressed_peft_checkpoint_in_the_next_script(
    peft_native: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``shardpoint_weights="compressed"`` on a PEFT model: the user's next script, a fresh
    process that never names shardpoint, loads the adapter with PEFT's own
    ``PeftModel.from_pretrained(checkpoint)`` and resumes with a plain ``Trainer`` (one
    script does both, the adapter loaded first). Before,
    the checkpoint had no ``adapter_config.json`` ("Can't find 'adapter_config.json'") and a
    base-model ``config.json`` naming ``PeftModelForCausalLM``."""
    ours = hf_run.train("peft-shardpoint-compressed", str(tmp_path / "ours"), 6)
    native_dir, native = peft_native
    assert ours["losses"] == native["losses"]
    mine, nat = tmp_path / "ours/checkpoint-3", native_dir / "checkpoint-3"
    assert (mine / "adapter_model.bin").read_bytes()[:8] == b"SPSINGLE"
    assert not (mine / "config.json").exists() and not (nat / "config.json").exists()
    assert json.loads((mine / "adapter_config.json").read_text()) == json.loads(
        (nat / "adapter_config.json").read_text()
    )
    code = (
        "import json, sys\n"
        "from peft import PeftModel\n"
        "from integration_helpers import hf_run\n"
        "from integration_helpers.common import digest\n"
        "for ck in sys.argv[1:3]:\n"
        "    m = PeftModel.from_pretrained(hf_run.make_model(), ck)\n"
        "    print('adapter', digest(m.state_dict()), flush=True)\n"
        # then a plain Trainer resumes from the checkpoint (hf_run's `peft-native` run)
        "print(json.dumps(hf_run.train('peft-native', sys.argv[3], 6, sys.argv[1])))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(hf_run.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(mine), str(nat), str(tmp_path / "r")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    loaded, reference = [x.split()[1] for x in lines if x.startswith("adapter ")]
    assert "shardpoint" not in code and loaded == reference
    resumed = json.loads(lines[-1])
    assert resumed["losses"] == ours["losses"][3:] and resumed["digest"] == ours["digest"]
    assert pickles_under(tmp_path / "ours") == []


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
    # each checkpoint is five saves: training_args.bin, optimizer.pt, scheduler.pt,
    # rng_state.pth, then the part whose commit marks it complete (it holds no tensor here, so
    # the hook cannot fire in it): killed writing checkpoint-6's scheduler.pt, the 8th
    proc = run_child_killed("hf_run", "shardpoint", str(tmp_path), "6", kill_at_save=8)
    assert proc.returncode == -9 and "SELFKILL mid-save" in proc.stdout, proc.stderr[-2000:]
    assert (tmp_path / "checkpoint-6").is_dir()  # left incomplete: no index
    assert (tmp_path / "checkpoint-6/optimizer.pt").is_file()
    assert not (tmp_path / "checkpoint-6/scheduler.pt").exists()
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
    damage_safetensors(bad / "model.safetensors", "transformer.h.0.attn.c_attn.weight")
    trainer = hf_run.build("shardpoint", str(tmp_path / "run"), 6)
    with pytest.raises(sp.ChecksumMismatchError, match="c_attn.weight"):
        trainer.train(resume_from_checkpoint=str(bad))
    shutil.copy(runs["base"] / "shardpoint/checkpoint-3/model.safetensors", bad)
    damage_value(str(bad / "optimizer.pt"), "state/0/exp_avg")
    trainer = hf_run.build("shardpoint", str(tmp_path / "run"), 6)
    with pytest.raises(sp.ChecksumMismatchError, match="exp_avg"):
        trainer.train(resume_from_checkpoint=str(bad))
    (bad / "shardpoint.index").unlink()
    with pytest.raises(sp.NotFoundError, match="shardpoint.index' is missing"):
        trainer.train(resume_from_checkpoint=str(bad))
