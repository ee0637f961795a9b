"""Run inside the vLLM virtual environment (``make vllm-venv``; vLLM pins its own torch, so it
never shares the project's .venv) by tests/serving/test_vllm_loader.py.

    vllm_child.py HF_DIR SP_DIR SP_TP1_DIR BROKEN_DIR TRAINER_CHECKPOINT_DIR

One process does every check (importing vLLM and its torch is most of the cost on a small
machine): the entry point, registry and extra-config checks, then the same prompt through every
load format. Prints one JSON object per line; the test reads them.
"""

from __future__ import annotations

import json
import sys
import time


def contract() -> None:
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "shardpoint"]
    print(json.dumps({"entry_point": [e.value for e in eps]}), flush=True)

    import vllm
    from vllm.config.load import LoadConfig
    from vllm.model_executor import model_loader
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what every vLLM process does: runs our entry point
    import shardpoint.vllm as spv

    got = type(model_loader.get_model_loader(LoadConfig(load_format="shardpoint")))
    sharded = type(model_loader.get_model_loader(LoadConfig(load_format="shardpoint_sharded")))
    auto = type(model_loader.get_model_loader(LoadConfig(load_format="auto")))
    table = dict(model_loader._LOAD_FORMAT_TO_MODEL_LOADER)
    spv.register()  # again, as a second plugin load in the same process would
    spv.register()
    same = table == dict(model_loader._LOAD_FORMAT_TO_MODEL_LOADER)
    errors = {}
    for extra in ({"bogus": 1}, {"threads": 0}, {"io": "nfs"}, {"window": "big"}):
        try:
            model_loader.get_model_loader(
                LoadConfig(load_format="shardpoint", model_loader_extra_config=extra)
            )
            errors[json.dumps(extra)] = None
        except ValueError as e:
            errors[json.dumps(extra)] = str(e)
    ok = model_loader.get_model_loader(
        LoadConfig(
            load_format="shardpoint", model_loader_extra_config={"threads": 2, "io": "pread"}
        )
    )
    print(
        json.dumps(
            {
                "vllm": vllm.__version__,
                "loader": f"{got.__module__}.{got.__qualname__}",
                "sharded": f"{sharded.__module__}.{sharded.__qualname__}",
                "auto": f"{auto.__module__}.{auto.__qualname__}",
                "auto_is_default": issubclass(auto, model_loader.DefaultModelLoader),
                "is_subclass": issubclass(got, model_loader.BaseModelLoader),
                "reentrant": same,
                "errors": errors,
                "options": ok.options,
            }
        ),
        flush=True,
    )


def generate(hf: str, sp: str, sp_tp1: str, broken: str, trainer: str) -> None:
    import gc

    from vllm import LLM, SamplingParams

    prompt = [{"prompt_token_ids": [1, 5, 9, 33, 70, 101, 7]}]
    params = SamplingParams(temperature=0, max_tokens=12, detokenize=False)
    for name, path, fmt in (("safetensors", hf, "safetensors"), ("shardpoint", sp, "shardpoint"),
                            ("shardpoint_sharded", sp_tp1, "shardpoint_sharded"),
                            ("shardpoint_on_hf_dir", hf, "shardpoint"),
                            ("auto", sp, "auto"), ("auto_on_hf_dir", hf, "auto"),
                            ("auto_on_trainer_checkpoint", trainer, "auto"),
                            ("shardpoint_on_trainer_checkpoint", trainer, "shardpoint"),
                            ("missing_weight", broken, "shardpoint")):  # fmt: skip
        t = time.perf_counter()
        try:
            llm = LLM(model=path, load_format=fmt, skip_tokenizer_init=True, dtype="bfloat16",
                      enforce_eager=True, max_model_len=64, max_num_seqs=1,
                      distributed_executor_backend="uni")  # fmt: skip
            tokens = list(llm.generate(prompt, params)[0].outputs[0].token_ids)
            out = {"run": name, "tokens": tokens}
            del llm
        except Exception as e:  # noqa: BLE001 - the refusal is the result of that run
            out = {"run": name, "error": f"{type(e).__name__}: {e}"}
        gc.collect()
        out["seconds"] = round(time.perf_counter() - t, 1)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    contract()
    generate(*sys.argv[1:6])
