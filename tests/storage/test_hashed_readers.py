"""A checkpoint saved with hashed prefixes (FORMAT.md §3.1.1: two writers, merged with
``sp.merge(hashed_prefixes=True)``) opened by the tools a user reaches for next, each in a fresh
process: ``sp.open``/``load_file``/``verify``, ``shardpoint.torch.load`` and
``weights_iterator``, ``shardpoint.hf.from_pretrained`` on a serving directory, the
``shardpoint verify``/``convert``/``export`` CLI (the safetensors file read by the safetensors
package, the exported serving directory by ``sp.load_file``), and a
``CheckpointManager`` directory (``latest_checkpoint``, a restore). Every value must come back
bit-exact (compared by sha256 of its bytes)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKEN = "c" * 32
# Every child prints {key: sha256 of the value's bytes} as one JSON line, last.
DIGESTS = (
    "import hashlib, json\n"
    "def digests(items):\n"
    "    return json.dumps({k: hashlib.sha256(bytes(memoryview(v))).hexdigest()"
    " for k, v in items}, sort_keys=True)\n"
)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(bytes(memoryview(np.ascontiguousarray(a)))).hexdigest()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A serving directory (config.json + the checkpoint ``model``) of a tiny GPT-2 whose
    weights two writers saved with hashed prefixes; and the weights' digests."""
    d = tmp_path_factory.mktemp("hashed") / "serve"
    d.mkdir()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    config.save_pretrained(d)
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    keys = sorted(sd)
    prefix = str(d / "model")
    for r in range(2):
        w = sp.Writer(
            prefix, rank=r, world_size=2, merge_token=TOKEN, hashed_prefixes=True, durable=False
        )
        for k in keys[r::2]:
            w.add(k, sd[k])
        w.commit()
    sp.merge(prefix, 2, token=TOKEN, hashed_prefixes=True, durable=False)
    assert (d / "model").is_dir() and (d / "model.index").is_file()  # really hashed
    return d, {k: _digest(v) for k, v in sd.items()}


def _child(code: str, *args: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", DIGESTS + code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_open_load_file_and_verify(model_dir: tuple[Path, dict[str, str]]) -> None:
    d, want = model_dir
    code = (
        "import sys, shardpoint as sp\n"
        "with sp.open(sys.argv[1]) as r:\n"
        "    r.verify()\n"
        "    lazy = {k: r[k] for k in r}\n"
        "assert digests(sp.load_file(sys.argv[1]).items()) == digests(lazy.items())\n"
        "print(digests(lazy.items()))\n"
    )
    assert _child(code, str(d / "model")) == want


def test_torch_load_weights_iterator_and_hf_from_pretrained(
    model_dir: tuple[Path, dict[str, str]],
) -> None:
    d, want = model_dir
    code = (
        "import sys, transformers, shardpoint.hf as sphf\n"
        "from shardpoint import torch as sptorch\n"
        "p = sys.argv[1] + '/model'\n"
        "sd = digests((k, v.numpy()) for k, v in sptorch.load(p).items())\n"
        "it = digests((k, v.numpy()) for k, v in sptorch.weights_iterator(p))\n"
        "m = sphf.from_pretrained(transformers.AutoModelForCausalLM, sys.argv[1], dtype='float32')\n"
        "hf = digests((k, v.detach().numpy()) for k, v in m.state_dict().items())\n"
        "assert sd == it == hf, (sd, it, hf)\n"
        "print(sd)\n"
    )
    assert _child(code, str(d)) == want


def test_cli_verify_convert_and_export(
    model_dir: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    d, want = model_dir
    cli = [sys.executable, "-m", "shardpoint"]
    subprocess.run([*cli, "verify", str(d / "model")], check=True, capture_output=True)
    out = tmp_path / "weights.safetensors"
    subprocess.run([*cli, "convert", str(d / "model"), str(out)], check=True, capture_output=True)
    served = tmp_path / "served"
    subprocess.run([*cli, "export", str(d), str(served)], check=True, capture_output=True)
    code = (
        "import sys, shardpoint as sp\n"
        "from safetensors.numpy import load_file\n"
        "st = digests(load_file(sys.argv[1]).items())\n"
        "assert st == digests(sp.load_file(sys.argv[2]).items())\n"
        "print(st)\n"
    )
    assert _child(code, str(out), str(served / "model")) == want


def test_manager_directory_latest_and_restore(tmp_path: Path) -> None:
    value = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    ckpt = sp.Checkpoint(v=sp.Variable(value))
    manager = sp.CheckpointManager(ckpt, tmp_path, max_to_keep=2, hashed_prefixes=True)
    manager.save()
    ckpt.v.assign(value * 2)
    latest = manager.save()
    manager.close()  # lets go of the directory's lock: the fresh process takes it
    assert os.path.isdir(latest)  # hashed: `P/` beside `P.index`
    code = (
        "import sys, numpy as np, shardpoint as sp\n"
        "d = sys.argv[1]\n"
        "latest = sp.latest_checkpoint(d)\n"
        "ck = sp.Checkpoint(v=sp.Variable(np.zeros((8, 5), np.float32)))\n"
        "m = sp.CheckpointManager(ck, d, max_to_keep=2, hashed_prefixes=True)\n"
        "assert m.restore_or_initialize() == latest, latest\n"
        "r = sp.load_checkpoint(latest)\n"
        "print(digests([('latest', np.frombuffer(latest.encode(), np.uint8)),"
        " ('v', ck.v.numpy()), ('get_tensor', r.get_tensor('v/.ATTRIBUTES/VARIABLE_VALUE'))]))\n"
    )
    got = _child(code, str(tmp_path))
    assert got == {
        "latest": _digest(np.frombuffer(latest.encode(), np.uint8)),
        "v": _digest(value * 2),
        "get_tensor": _digest(value * 2),
    }
