"""shardpoint.torch.load_into: decoding straight into a model's tensors."""

from __future__ import annotations

import pytest
import torch

import shardpoint.torch as spt


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.body = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("steps", torch.tensor(3))


def _pair(seed_a: int, seed_b: int) -> tuple[Tied, Tied]:
    torch.manual_seed(seed_a)
    a = Tied()
    torch.manual_seed(seed_b)
    return a, Tied()


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_values_are_decoded_into_the_models_own_memory(tmp_path, compression):
    src, dst = _pair(0, 1)
    p = str(tmp_path / "m")
    spt.save_model(src, p, compression=compression, durable=False)
    ptrs = {n: t.data_ptr() for n, t in dst.state_dict().items()}
    res = spt.load_into(dst, p)
    assert res.missing_keys == [] and res.unexpected_keys == []
    for n, t in dst.state_dict().items():
        assert t.data_ptr() == ptrs[n]
        assert torch.equal(t, src.state_dict()[n]), n
    assert dst.head.weight is dst.emb.weight


def test_bfloat16_and_a_dtype_cast_like_load_state_dict(tmp_path):
    src, dst = _pair(0, 1)
    src = src.to(torch.bfloat16)
    p = str(tmp_path / "m")
    spt.save_model(src, p, durable=False)
    bf, f32 = _pair(2, 3)
    bf = bf.to(torch.bfloat16)
    spt.load_into(bf, p)
    spt.load_into(f32, p)  # stored bf16 -> float32 model: copy_ casts
    for n, t in src.state_dict().items():
        assert torch.equal(bf.state_dict()[n], t)
        assert torch.equal(f32.state_dict()[n], t.to(f32.state_dict()[n].dtype))


def test_non_contiguous_targets_are_filled_by_copy(tmp_path):
    w = torch.randn(64, 32)
    p = str(tmp_path / "m")
    spt.save({"w": w}, p, durable=False)
    target = torch.zeros(32, 64).t()  # a transposed view: not contiguous
    spt.load_into({"w": target}, p)
    assert torch.equal(target, w)


def test_missing_and_unexpected_raise_before_writing(tmp_path):
    src, dst = _pair(0, 1)
    p = str(tmp_path / "m")
    state = src.state_dict()
    del state["norm.bias"]
    state["extra"] = torch.ones(2)
    spt.save(state, p, durable=False)
    before = {n: t.clone() for n, t in dst.state_dict().items()}
    with pytest.raises(
        RuntimeError, match=r'(?s)Missing key\(s\).*"norm.bias".*Unexpected.*"extra"'
    ):
        spt.load_into(dst, p)
    for n, t in dst.state_dict().items():
        assert torch.equal(t, before[n])
    res = spt.load_into(dst, p, strict=False)
    assert res.missing_keys == ["norm.bias"] and res.unexpected_keys == ["extra"]
    assert torch.equal(dst.norm.weight, src.norm.weight)


def test_size_mismatch_is_torchs_sentence(tmp_path):
    p = str(tmp_path / "m")
    spt.save({"w": torch.zeros(3, 4)}, p, durable=False)
    with pytest.raises(
        RuntimeError, match=r"size mismatch for w: copying a param with shape \[3, 4\]"
    ):
        spt.load_into({"w": torch.zeros(4, 3)}, p)
