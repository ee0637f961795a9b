"""A delta checkpoint exported back to a Hugging Face directory in one command: a tiny BERT
(built from a config, no download) fine-tuned, stored with ``convert FT DELTA --base BASE``
(config and other files kept), then ``convert DELTA OUT --to hf``; a fresh process loads OUT
with transformers' ``from_pretrained`` and finds the fine-tune's tensors bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

_BUILD = r"""
import sys, torch
from transformers import BertConfig, BertModel
base_dir, ft_dir = sys.argv[1:3]
cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=16)
torch.manual_seed(0)
m = BertModel(cfg)
m.save_pretrained(base_dir)
with torch.no_grad():  # a fine-tune: the encoder moves a little, the embeddings stay
    for name, p in m.named_parameters():
        if name.startswith("encoder.layer.0.attention"):
            p.add_(torch.randn_like(p) * 1e-3)
m.save_pretrained(ft_dir)
"""

_CHECK = r"""
import sys, torch
from safetensors.torch import load_file
from transformers import BertModel
out, ft_dir = sys.argv[1:3]
m = BertModel.from_pretrained(out)
want = load_file(ft_dir + "/model.safetensors")
got = m.state_dict()
assert set(want) <= set(got), sorted(set(want) - set(got))
bad = [k for k in want if not torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))]
assert not bad, bad
print("ok", len(want))
"""


def test_delta_exports_to_a_loadable_hf_directory(tmp_path: os.PathLike[str]) -> None:
    d = str(tmp_path)
    base_dir, ft_dir = os.path.join(d, "base-hf"), os.path.join(d, "ft-hf")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, *a], check=True, env=env, capture_output=True, text=True
    )
    run("-c", _BUILD, base_dir, ft_dir)
    cli = ["-m", "shardpoint", "convert"]
    base, delta, out = (os.path.join(d, x) for x in ("base", "delta", "out"))
    run(*cli, base_dir, base)
    run(*cli, ft_dir, delta, "--base", base)
    import shardpoint.delta as spd

    described = spd.describe(delta)
    modes = {t["mode"] for t in described["tensors"].values()}
    assert described["depth"] == 1 and "same" in modes  # a real delta, not a full copy
    run(*cli, delta, out, "--to", "hf")
    assert os.path.exists(os.path.join(out, "config.json"))
    assert "ok" in run("-c", _CHECK, out, ft_dir).stdout
