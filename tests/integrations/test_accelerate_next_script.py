"""accelerate's big-model loading in the user's next script, in a fresh process that never
imports shardpoint: ``load_checkpoint_and_dispatch(model, DIR, device_map=...)`` and
``load_checkpoint_in_model`` on what shardpoint wrote — a serving directory
(``shardpoint export``), a converted prefix (``shardpoint convert``), its ``.index`` file, and an
``accelerator.save_state`` directory whose weights are compressed in the part
(``ShardpointAccelerator(shardpoint_weights="compressed")``). Before this front accelerate said
"DIR is not a folder containing a `.index.json` file or a pytorch_model.bin or a
model.safetensors file", never "shardpoint". accelerate's own loop places every weight
(``device_map`` with CPU and disk offload, ``dtype``, ``strict``), so each case is compared
with the same call on the Hugging Face directory the model came from."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from integration_helpers.common import tiny_llama  # noqa: E402

#: the user's next script: build the model empty, load it the accelerate way, print digests
USER_SCRIPT = """
import hashlib, json, sys, torch, transformers
from accelerate import init_empty_weights, load_checkpoint_and_dispatch
from accelerate.utils import load_checkpoint_in_model

def build(src):
    cfg = transformers.AutoConfig.from_pretrained(src)
    with init_empty_weights():
        return transformers.AutoModelForCausalLM.from_config(cfg)

def tags(m):
    return {k: (str(v.dtype), hashlib.sha256(v.float().numpy().tobytes()).hexdigest())
            for k, v in m.state_dict().items()}

def run(src, path, offload):
    m = build(src)
    if CALL == "dispatch":
        device_map = {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu",
                      "lm_head": "disk"} if offload else "auto"
        m = load_checkpoint_and_dispatch(m, path, device_map=device_map, offload_folder=offload,
                                         dtype=torch.float16)
        with torch.no_grad():
            out = m(torch.tensor([[1, 5, 9, 2]])).logits
        return {"logits": hashlib.sha256(out.float().numpy().tobytes()).hexdigest(),
                "offloaded": sorted(os.listdir(offload)) if offload else []}
    m = m.to_empty(device="cpu")
    load_checkpoint_in_model(m, path)
    return {"tags": tags(m)}

import os
CALL, SRC, HF, OFF = sys.argv[1:5]
out = {}
for i, path in enumerate(sys.argv[5:]):
    off = f"{OFF}-{i}" if OFF != "-" else None
    ours = run(SRC, path, off + "-ours" if off else None)
    ref = run(SRC, HF, off + "-ref" if off else None)
    out[path] = {"same": ours == ref, "ours": ours}
print(json.dumps({"paths": out, "loaded": "shardpoint" in sys.modules}))
"""


def _child(
    *args: str, env: dict[str, str] | None = None, code: str = USER_SCRIPT
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300, env=full,
    )  # fmt: skip


def _cli(*args: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shardpoint", *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """A tiny Llama's Hugging Face directory and what shardpoint makes of it."""
    root = tmp_path_factory.mktemp("accelerate_next")
    model = tiny_llama(5)
    model.save_pretrained(root / "hf")
    _cli("export", str(root / "hf"), str(root / "serve"))
    _cli("convert", str(root / "hf"), str(root / "ck"))
    from shardpoint.integrations.accelerate import ShardpointAccelerator

    acc = ShardpointAccelerator(cpu=True, shardpoint_weights="compressed")
    # two prepared models: accelerate's model.safetensors is the first one's
    first, _second = acc.prepare(model, torch.nn.Linear(3, 2))
    acc.save_state(str(root / "state"))
    assert not list((root / "state").glob("*.safetensors"))
    return {"hf": root / "hf", "serve": root / "serve", "ck": root / "ck", "state": root / "state"}


@pytest.mark.parametrize("call", ["dispatch", "in_model"])
def test_accelerate_loads_what_shardpoint_wrote_in_the_next_script(
    written: dict[str, pathlib.Path], call: str, tmp_path: pathlib.Path
) -> None:
    paths = [str(written["serve"]), str(written["ck"]), str(written["ck"]) + ".index"]
    paths.append(str(written["state"]))
    offload = str(tmp_path / "offload") if call == "dispatch" else "-"
    p = _child(call, str(written["hf"]), str(written["hf"]), offload, *paths)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["loaded"]  # imported by the front, only once a path was ours
    assert sorted(got["paths"]) == sorted(paths)
    for path, each in got["paths"].items():
        assert each["same"], (path, each)
        if call == "dispatch":  # lm_head went to disk, as accelerate offloads it
            assert each["ours"]["offloaded"] == ["index.json", "lm_head.weight.dat"], path


def test_other_paths_stay_accelerates(written: dict[str, pathlib.Path]) -> None:
    """The Hugging Face directory loads without importing shardpoint; a path that is nothing
    gets accelerate's own error."""
    hf = str(written["hf"])
    p = _child("in_model", hf, hf, "-", hf)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["paths"][hf]["same"] and not got["loaded"]
    p = _child("in_model", hf, hf, "-", hf + "-missing")
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode != 0 and last.startswith("ValueError: `checkpoint` should be the path")


def test_turned_off_and_damaged_checkpoints_name_shardpoint(
    written: dict[str, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    hf, serve = str(written["hf"]), str(written["serve"])
    p = _child("in_model", hf, hf, "-", serve, env={"SHARDPOINT_TORCH_LOAD": "0"})
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode != 0 and last.startswith("ValueError")
    assert "is a shardpoint checkpoint" in last and "model_weights(path)" in last
    # a torn index: shardpoint's error names the file
    torn = tmp_path / "torn"
    torn.mkdir()
    for f in written["serve"].iterdir():
        (torn / f.name).write_bytes(f.read_bytes())
    index = torn / "model.index"
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    p = _child("in_model", hf, hf, "-", str(torn))
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode != 0 and "CorruptCheckpointError" in last and "model.index" in last


def test_the_front_installed_after_accelerate_was_imported_reaches_its_names(
    written: dict[str, pathlib.Path],
) -> None:
    """No startup file (a source tree on PYTHONPATH): ``import shardpoint`` installs the hook
    after accelerate bound ``load_checkpoint_in_model`` in ``accelerate.utils`` and
    ``accelerate.big_modeling``; the names the user imported from there are fronted too."""
    hf, serve = str(written["hf"]), str(written["serve"])
    code = f"""
    import sys, _shardpoint_loaders
    for f in list(sys.meta_path):  # as if the startup file had not run
        if type(f).__name__ == "_AfterImport":
            sys.meta_path.remove(f)
    import transformers
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    cfg = transformers.AutoConfig.from_pretrained({hf!r})
    def empty():
        with init_empty_weights():
            return transformers.AutoModelForCausalLM.from_config(cfg)
    try:
        load_checkpoint_and_dispatch(empty(), {serve!r}, device_map="auto")
    except ValueError as e:
        print("before:", "model.safetensors" in str(e))
    import shardpoint
    m = load_checkpoint_and_dispatch(empty(), {serve!r}, device_map="auto")
    print("after:", m.lm_head.weight.device.type)
    """
    p = _child(code=code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-2:] == ["before: True", "after: cpu"]
