"""transformers straight from shardpoint checkpoints: a tiny Llama built from a config,
``save_pretrained``, converted (config and tokenizer kept inside the checkpoint), and loaded
back through ``shardpoint.hf.from_pretrained`` / ``load_into``: identical logits. Also: the
exports write ``dtype`` into config.json (vLLM reads it; without *.safetensors it cannot guess
it)."""

from __future__ import annotations

import json
import pathlib

import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
tokenizers = pytest.importorskip("tokenizers")

import shardpoint.hf as sphf  # noqa: E402
from shardpoint.convert import convert  # noqa: E402
from shardpoint.convert.serving import export_serving  # noqa: E402

IDS = torch.tensor([[2, 3, 4, 5, 7, 11]])


def _model(tie: bool, dtype: torch.dtype) -> object:
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=40, max_position_embeddings=64,
        tie_word_embeddings=tie,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def _tokenizer(path: pathlib.Path) -> object:
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "hello", "world", "shard", "point"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]"
    )
    fast.save_pretrained(path)
    return fast


def _logits(model: object) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits  # type: ignore[operator]


@pytest.mark.parametrize(("tie", "dtype"), [(False, torch.bfloat16), (True, torch.float32)])
def test_from_pretrained_identical_logits(tmp_path: pathlib.Path, tie: bool, dtype: object) -> None:
    model = _model(tie, dtype)  # type: ignore[arg-type]
    hf = tmp_path / "hf"
    model.save_pretrained(hf)  # type: ignore[attr-defined]
    tok = _tokenizer(hf)
    # the reference: transformers loading its own directory (a bf16 model cast with .to() also
    # casts its rotary buffer, which from_pretrained keeps in float32)
    want = _logits(transformers.AutoModelForCausalLM.from_pretrained(hf).eval())
    convert(str(hf), str(tmp_path / "ck"))
    back = sphf.from_pretrained(transformers.AutoModelForCausalLM, str(tmp_path / "ck"))
    assert type(back).__name__ == "LlamaForCausalLM" and not back.training
    assert next(back.parameters()).dtype == dtype
    assert torch.equal(_logits(back), want)
    if tie:
        assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    # the kept tokenizer comes back too
    with sphf.files_dir(str(tmp_path / "ck")) as d:
        tok2 = transformers.AutoTokenizer.from_pretrained(d)
    assert tok2("hello point")["input_ids"] == tok("hello point")["input_ids"]  # type: ignore[operator]
    # a concrete class, another dtype, and a serving directory
    export_serving(str(hf), str(tmp_path / "serve"))
    f32 = sphf.from_pretrained(
        transformers.LlamaForCausalLM, str(tmp_path / "serve"), dtype=torch.float32
    )
    assert next(f32.parameters()).dtype == torch.float32
    ref = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    assert torch.equal(_logits(f32), _logits(ref))


def test_load_into_an_empty_model(tmp_path: pathlib.Path) -> None:
    model = _model(False, torch.bfloat16)
    model.save_pretrained(tmp_path / "hf")  # type: ignore[attr-defined]
    convert(str(tmp_path / "hf"), str(tmp_path / "ck"), compression="none")
    with accelerate.init_empty_weights():
        empty = transformers.AutoModelForCausalLM.from_config(model.config)  # type: ignore[attr-defined]
    assert next(empty.parameters()).device.type == "meta"
    result = sphf.load_into(empty, str(tmp_path / "ck"), io="pread")
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert all(p.device.type == "cpu" for p in empty.parameters())
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert torch.equal(_logits(empty.eval()), _logits(ref))
    # strict: a checkpoint without one weight leaves it on meta and says so
    with sp.open(str(tmp_path / "ck")) as r:
        state = r.load()
    del state["model.layers.1.mlp.up_proj.weight"]
    sp.save_file(state, str(tmp_path / "short"))
    with accelerate.init_empty_weights():
        empty = transformers.AutoModelForCausalLM.from_config(model.config)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="up_proj"):
        sphf.load_into(empty, str(tmp_path / "short"))


def test_exports_write_dtype_into_config(tmp_path: pathlib.Path) -> None:
    model = _model(False, torch.bfloat16)
    model.save_pretrained(tmp_path / "hf")  # type: ignore[attr-defined]
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.pop("dtype", None)
    cfg.pop("torch_dtype", None)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    convert(str(tmp_path / "hf"), str(tmp_path / "ck"))
    sp.export_hf(str(tmp_path / "ck"), str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    export_serving(str(tmp_path / "ck"), str(tmp_path / "serve"))
    assert json.loads((tmp_path / "serve" / "config.json").read_text())["dtype"] == "bfloat16"
    assert not any(p.name.endswith(".safetensors") for p in (tmp_path / "serve").iterdir())
