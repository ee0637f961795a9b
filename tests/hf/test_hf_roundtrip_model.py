"""A Hugging Face round trip keeps the model: ``shardpoint convert DIR P`` keeps the directory's
config and tokenizer files with the checkpoint, and ``convert --to hf`` / ``sp.export_hf`` write
them back so that ``transformers``' ``from_pretrained`` loads the result (a tiny random GPT-2
built from a config and a word-level tokenizer built in code: no downloads)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import shardpoint as sp
from shardpoint.convert.hf_files import SECTION

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")


def _tiny_model_dir(path: pathlib.Path) -> tuple[object, object]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=16, vocab_size=12)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(path)
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "hello", "world", "shard", "point"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    )
    fast.save_pretrained(path)
    (path / "README.md").write_text("# tiny\nmodel card\n")
    (path / "blob.bin.extra").write_bytes(bytes(range(256)))  # not UTF-8: kept as base64
    return model, fast


def _cli(*args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "shardpoint", "convert", *args], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def _same_model(model: object, out: pathlib.Path, tok: object) -> None:
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, back(ids).logits)  # type: ignore[operator]
    tok2 = transformers.AutoTokenizer.from_pretrained(out)
    assert tok2("hello world")["input_ids"] == tok("hello world")["input_ids"]  # type: ignore[operator]
    assert (out / "README.md").read_text() == "# tiny\nmodel card\n"
    assert (out / "blob.bin.extra").read_bytes() == bytes(range(256))


def test_convert_and_export_keep_config_and_tokenizer(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "hf"
    model, tok = _tiny_model_dir(src)
    ck = str(tmp_path / "ck" / "model")
    _cli(str(src), ck)
    with sp.open(ck) as r:
        names = {f["name"] for f in r.sections[SECTION]["files"]}
        assert not any(k.startswith(".") for k in r.keys())  # files are not entries
    assert {"config.json", "generation_config.json", "tokenizer.json", "README.md"} <= names
    assert "model.safetensors" not in names
    out = tmp_path / "out_cli"
    _cli("--to", "hf", ck, str(out))
    _same_model(model, out, tok)
    out2 = tmp_path / "out_api"
    sp.export_hf(ck, out2)
    _same_model(model, out2, tok)
    # a checkpoint with the weights only still exports (nothing kept, nothing written)
    sp.save_file(sp.load_file(ck), str(tmp_path / "bare"))
    sp.export_hf(str(tmp_path / "bare"), tmp_path / "out_bare")
    assert sorted(os.listdir(tmp_path / "out_bare")) == ["model.safetensors"]


def test_hostile_kept_file_names_are_refused(tmp_path: pathlib.Path) -> None:
    import numpy as np

    for name in ["../escape.txt", "/abs.txt", "a/../../b", ".hidden", "sub\\x"]:
        section = {
            SECTION: {"version": 1, "files": [{"name": name, "encoding": "utf-8", "data": "x"}]}
        }
        p = str(tmp_path / "ck")
        sp.save_file({"w": np.ones(2, np.float32)}, p, _sections=section)
        with pytest.raises(sp.CorruptCheckpointError, match="not allowed"):
            sp.export_hf(p, tmp_path / "out", overwrite=True)
        assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "out").exists()
    section = {
        SECTION: {
            "version": 1,
            "files": [{"name": "model.safetensors", "encoding": "utf-8", "data": "evil"}],
        }
    }
    sp.save_file({"w": np.ones(2, np.float32)}, p, _sections=section)
    result = sp.export_hf(p, tmp_path / "out2")
    assert any("would replace the exported weights" in n for n in result.notes)
    from safetensors.numpy import load_file

    assert list(load_file(tmp_path / "out2" / "model.safetensors")) == ["w"]
