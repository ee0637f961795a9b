"""``shardpoint convert SRC DST --base BASE`` (a fine-tune stored against its base) and the
per-tensor choice in ``shardpoint info`` (docs/DELTA.md), run in-process through ``main``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file as st_save

import shardpoint as sp
from shardpoint.cli.main import main


def test_convert_with_base_and_info(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(3)
    base = {
        "emb": rng.standard_normal((512, 64)).astype(np.float32),  # frozen: same
        "w": rng.standard_normal((256, 64)).astype(np.float32),  # fine-tuned: xor
    }
    tuned = {k: v.copy() for k, v in base.items()}
    tuned["w"][::9] += 1e-3
    tuned["head"] = rng.standard_normal(64).astype(np.float32)  # new: whole
    bp, src, dst = (os.path.join(tmp_path, n) for n in ("base", "tuned.safetensors", "ft"))
    sp.save_file(base, bp)
    st_save(tuned, src)
    assert main(["convert", src, dst, "--base", bp]) == 0
    out = capsys.readouterr().out
    assert "1 same, 1 xor, 1 whole" in out
    got = sp.load_file(dst)
    assert sorted(got) == sorted(tuned)
    for k, v in tuned.items():
        assert got[k].tobytes() == v.tobytes()
    assert main(["info", dst, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    modes = {k: t["mode"] for k, t in doc["delta"]["tensors"].items()}
    assert modes == {"emb": "same", "w": "xor", "head": "full"}
    assert doc["delta"]["tensors"]["emb"]["stored_bytes"] == 0
    assert doc["delta"]["depth"] == 1
    assert main(["info", dst]) == 0
    text = capsys.readouterr().out
    assert "delta:" in text and "xor" in text and "emb" in text
    assert main(["convert", src, dst, "--base", bp]) != 0  # exists without --force
