"""SGLang, for real, in its own environment (``make sglang-venv``; SGLang pins its own torch).
Its engine needs CUDA kernels, so on CPU the class contract is what runs: SGLang's own
``get_model_loader`` given our class as ``load_format`` (what ``sgl.Engine(load_format=...)``
passes down) returns our loader, a subclass of SGLang's ``BaseModelLoader`` with the abstract
methods implemented, whose options are checked and whose ``download_model`` finds the
checkpoint of a serving directory (and refuses a directory without one)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

CHILD = r"""
import json, sys
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader import loader as sgl
from shardpoint.sglang import ShardpointModelLoader as L

got = sgl.get_model_loader(LoadConfig(load_format=L, model_loader_extra_config={"threads": 2}))
out = {"type": type(got).__name__, "module": type(got).__module__,
       "subclass": isinstance(got, sgl.BaseModelLoader),
       "abstract": sorted(getattr(L, "__abstractmethods__", ())), "options": got.options}
try:
    sgl.get_model_loader(LoadConfig(load_format=L, model_loader_extra_config={"bogus": 1}))
except ValueError as e:
    out["refused"] = str(e)

class MC:  # the one ModelConfig attribute the loader reads
    model_path = sys.argv[1]
got.download_model(MC())
MC.model_path = sys.argv[2]
try:
    got.download_model(MC())
except Exception as e:
    out["empty"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def test_sglang_class_contract(tmp_path: pathlib.Path) -> None:
    py = os.environ.get("SHARDPOINT_SGLANG_PYTHON", "")
    if not py or not os.path.exists(py):
        if os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") == "1":
            pytest.fail(f"the SGLang environment is missing ({py}): run `make sglang-venv`")
        pytest.skip("no SGLang environment (make sglang-venv)")
    import shardpoint as sp

    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "config.json").write_text("{}")
    sp.save_file({"w": __import__("numpy").ones(3)}, str(tmp_path / "serve" / "model"))
    (tmp_path / "empty").mkdir()
    r = subprocess.run(
        [py, "-c", CHILD, str(tmp_path / "serve"), str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        timeout=900,
        # shardpoint from this checkout (no entry point needed here): its python/ folder
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(sp.__file__).resolve().parents[1])},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["type"] == "ShardpointModelLoader" and out["module"] == "shardpoint.sglang._loader"
    assert out["subclass"] is True and out["abstract"] == []
    assert out["options"] == {"threads": 2}
    assert "'bogus'" in out["refused"]
    assert "NotFoundError" in out["empty"] and "empty" in out["empty"]


DEFAULT_CHILD = r"""
import json, site, sys
site.addsitedir(sys.argv[1])  # the checkout's python/ with its startup file, as pip installs it
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader import get_model_loader
from sglang.srt.model_loader import loader as sgl

class MC:  # the ModelConfig attributes get_model_loader reads
    quantization = None
    def __init__(self, path):
        self.model_path = path
    def _is_already_quantized(self):
        return False

out = {}
for name in sys.argv[2:]:
    got = get_model_loader(LoadConfig(load_format="auto"), MC(name))
    out[name] = type(got).__module__ + "." + type(got).__name__
out["imported"] = "shardpoint" in sys.modules
print(json.dumps(out))
"""


def test_sglang_default_load_format_takes_a_serving_directory(tmp_path: pathlib.Path) -> None:
    """``sglang.launch_server --model-path DIR`` (load format ``auto``, the only one its closed
    enum lets a command line name for us): the startup file's front answers SGLang's
    ``get_model_loader`` with our loader for a serving directory and for a ``ShardpointTrainer``
    checkpoint with compressed weights, and SGLang's own ``DefaultModelLoader`` for a Hugging
    Face directory or a trainer checkpoint with ``model.safetensors`` (shardpoint then never
    imported when only those are asked)."""
    py = os.environ.get("SHARDPOINT_SGLANG_PYTHON", "")
    if not py or not os.path.exists(py):
        if os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") == "1":
            pytest.fail(f"the SGLang environment is missing ({py}): run `make sglang-venv`")
        pytest.skip("no SGLang environment (make sglang-venv)")
    import numpy as np
    from safetensors.numpy import save_file

    import shardpoint as sp
    from shardpoint.integrations._state import save_tree

    serve, hf, ckpt, st_ckpt = (tmp_path / n for n in ("serve", "hf", "ckpt", "st_ckpt"))
    for d in (serve, hf, ckpt, st_ckpt):
        d.mkdir()
        (d / "config.json").write_text("{}")
    sp.save_file({"w": np.ones(3)}, str(serve / "model"))
    save_file({"w": np.ones(3)}, str(hf / "model.safetensors"))
    # a ShardpointTrainer checkpoint: its weights compressed in its part, its optimizer.pt and
    # training_args.bin our single files (not weights); and one with model.safetensors
    for d in (ckpt, st_ckpt):
        save_tree({"model": {"w": np.ones(3)}}, str(d / "shardpoint"), integration="hf_trainer")
        for name in ("optimizer.pt", "training_args.bin"):
            save_tree({"x": 1}, str(d / name), integration="hf_trainer", single_file=True)
    save_file({"w": np.ones(3)}, str(st_ckpt / "model.safetensors"))
    python_dir = str(pathlib.Path(sp.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ours = [str(serve), str(ckpt)]
    for args, imported in (([str(hf)], False), ([*ours, str(hf), str(st_ckpt)], True)):
        r = subprocess.run(
            [py, "-c", DEFAULT_CHILD, python_dir, *args],
            capture_output=True, text=True, timeout=900, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-4000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out.pop("imported") is imported
        theirs = "sglang.srt.model_loader.loader.DefaultModelLoader"
        want = {a: theirs for a in args}
        want.update({a: "shardpoint.sglang._loader.ShardpointModelLoader" for a in ours})
        assert out == {a: want[a] for a in args}
