"""Issue 25: ``load_model`` takes the load-into path for plain CPU models (and keeps the general
path for modules that customise loading); ``load_into`` reads Hugging Face directories."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

import shardpoint.torch as spt


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(40, 8)
        self.body = torch.nn.Linear(8, 8)
        self.register_buffer("steps", torch.tensor(3))


class Custom(Net):
    """Renames a legacy key while loading: only ``load_state_dict`` runs this."""

    seen = 0

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        Custom.seen += 1
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def test_load_model_writes_into_the_models_own_tensors(tmp_path):
    torch.manual_seed(0)
    src = Net()
    torch.manual_seed(1)
    dst = Net()
    p = str(tmp_path / "m")
    spt.save_model(src, p, durable=False)
    ptrs = {n: t.data_ptr() for n, t in dst.state_dict().items()}
    res = spt.load_model(dst, p)
    assert res.missing_keys == [] and res.unexpected_keys == []
    for n, t in dst.state_dict().items():
        assert t.data_ptr() == ptrs[n], n  # decoded in place, not replaced by a fresh tensor
        assert torch.equal(t, src.state_dict()[n]), n


def test_load_model_keeps_load_state_dict_for_custom_modules(tmp_path):
    src, dst = Custom(), Custom()
    p = str(tmp_path / "m")
    spt.save_model(src, p, durable=False)
    Custom.seen = 0
    spt.load_model(dst, p)
    assert Custom.seen == 1
    assert torch.equal(dst.body.weight, src.body.weight)


def test_load_into_a_model_from_a_hugging_face_directory(tmp_path):
    torch.manual_seed(2)
    src = Net().to(torch.bfloat16)
    dst = Net().to(torch.bfloat16)
    d = tmp_path / "hf"
    d.mkdir()
    save_file(src.state_dict(), str(d / "model.safetensors"))
    ptrs = {n: t.data_ptr() for n, t in dst.state_dict().items()}
    res = spt.load_into(dst, str(d))
    assert res.missing_keys == [] and res.unexpected_keys == []
    for n, t in dst.state_dict().items():
        assert t.data_ptr() == ptrs[n], n
        assert torch.equal(t, src.state_dict()[n]), n


class Renaming(Net):
    """Maps a legacy name while loading, in ``load_state_dict`` itself."""

    def load_state_dict(self, state_dict, strict=True, assign=False):  # type: ignore[no-untyped-def, override]
        state_dict = {k.replace("old_body", "body"): v for k, v in state_dict.items()}
        return super().load_state_dict(state_dict, strict, assign)


def test_load_model_keeps_a_load_state_dict_override(tmp_path):
    torch.manual_seed(4)
    src = Net()
    p = str(tmp_path / "m")
    state = {k.replace("body", "old_body"): v for k, v in src.state_dict().items()}
    spt.save(state, p, durable=False)
    dst = Renaming()
    spt.load_model(dst, p)
    assert torch.equal(dst.body.weight, src.body.weight)
