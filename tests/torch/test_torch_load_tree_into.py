"""Issue 25: the trainer integrations' resume reads (``integrations._state.load_tree(into=)``,
over ``sptorch``'s loader) decode straight into the live tensors that will receive the values,
and fall back to fresh tensors wherever that would not be exactly load + copy_."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shardpoint.torch as spt
from integration_helpers.common import bits
from shardpoint.integrations._state import load_tree, module_targets


def _save(tree: dict, path) -> str:  # type: ignore[no-untyped-def, type-arg]
    p = str(path / "c")
    spt.save(tree, p, durable=False)
    return p


def test_matching_tensors_are_filled_in_place_and_the_rest_come_back_fresh(tmp_path):
    g = torch.Generator().manual_seed(0)
    saved = {
        "a": torch.randn(64, 32, generator=g),
        "b": torch.randn(8, generator=g).to(torch.bfloat16),
        "c": torch.randn(5, 5, generator=g),  # live one has another dtype: fresh, cast later
        "d": torch.randn(4, 6, generator=g),  # live one is not contiguous: fresh
        "e": torch.randn(3, generator=g),  # live one has another shape: fresh, error later
        "n": np.arange(6.0),  # saved as numpy: stays numpy
        "f": torch.randn(7, generator=g),  # no live tensor: fresh
        "step": 3,
    }
    p = _save(saved, tmp_path)
    live = {
        "a": torch.zeros(64, 32),
        "b": torch.zeros(8, dtype=torch.bfloat16),
        "c": torch.zeros(5, 5, dtype=torch.float64),
        "d": torch.zeros(6, 4).t(),
        "e": torch.zeros(4),
        "n": torch.zeros(6, dtype=torch.float64),
    }
    before = {k: t.data_ptr() for k, t in live.items()}
    out = load_tree(p, integration="test", into=live)
    assert out["a"] is live["a"] and out["b"] is live["b"]
    assert live["a"].data_ptr() == before["a"]
    for k in ("a", "b"):
        assert torch.equal(live[k].view(torch.uint8), saved[k].view(torch.uint8)), k
    for k in ("c", "d", "e", "f"):
        assert out[k] is not live.get(k) and torch.equal(out[k], saved[k]), k
    assert not live["c"].any() and not live["d"].any() and not live["e"].any()
    assert isinstance(out["n"], np.ndarray) and not live["n"].any()
    assert out["step"] == 3


def test_tied_and_overlapping_targets_keep_load_state_dicts_rules(tmp_path):
    # saved tied (one stored value + an alias): the shared live tensor is filled once
    src = torch.nn.Linear(4, 4, bias=False)
    tied = {"w1": src.weight, "w2": src.weight}
    p = _save(tied, tmp_path)
    live = torch.zeros(4, 4)
    out = load_tree(p, integration="test", into={"w1": live, "w2": live})
    assert out["w1"] is live and torch.equal(live, src.weight.detach())
    assert out["w2"].data_ptr() == live.data_ptr()
    # saved as two values, live as one memory: which one lands stays load_state_dict's
    # business (both come back fresh, the live tensor is untouched)
    q = tmp_path / "two"
    q.mkdir()
    p2 = _save({"x": torch.ones(4), "y": torch.full((4,), 2.0)}, q)
    one = torch.zeros(4)
    out = load_tree(p2, integration="test", into={"x": one, "y": one.view(4)})
    assert out["x"] is not one and out["y"] is not one and not one.any()
    assert torch.equal(out["x"], torch.ones(4)) and torch.equal(out["y"], torch.full((4,), 2.0))


def test_views_of_one_storage_fill_their_live_views(tmp_path):
    # saved as views of one storage (DeepSpeed's flat parameter buffers): each live view is
    # filled; the members without a live tensor still share one fresh storage as saved
    flat = torch.arange(12.0)
    p = _save({"p": flat[:4], "q": flat[4:10], "r": flat[10:]}, tmp_path)
    live = torch.zeros(12)
    out = load_tree(p, integration="test", into={"p": live[:4], "q": live[4:10]})
    assert torch.equal(live[:10], torch.arange(10.0)) and not live[10:].any()
    assert out["p"].data_ptr() == live.data_ptr()
    assert torch.equal(out["r"], torch.tensor([10.0, 11.0]))


def test_a_target_function_sees_the_skeleton_and_may_refuse_before_anything_is_written(
    tmp_path,
):
    p = _save({"models": [{"w": torch.ones(3)}], "step": 1}, tmp_path)
    live = torch.zeros(3)
    seen = []

    def refuse(skeleton):  # type: ignore[no-untyped-def]
        seen.append(skeleton)
        raise ValueError("two models expected")

    with pytest.raises(ValueError, match="two models"):
        load_tree(p, integration="test", into=refuse)
    assert seen == [{"models": [{"w": None}], "step": None}] and not live.any()
    out = load_tree(p, integration="test", into=lambda s: {"models": [{"w": live}]})
    assert out["models"][0]["w"] is live and torch.equal(live, torch.ones(3))


def test_modules_that_customise_loading_get_no_targets():
    class Renaming(torch.nn.Linear):
        def load_state_dict(self, state_dict, strict=True, assign=False):  # type: ignore[no-untyped-def, override]
            return super().load_state_dict(state_dict, strict, assign)

    plain = torch.nn.Linear(2, 2)
    assert set(module_targets(plain)) == {"weight", "bias"}
    assert module_targets(Renaming(2, 2)) is None
    hooked = torch.nn.Linear(2, 2)
    hooked.register_load_state_dict_pre_hook(lambda *a: None)
    assert module_targets(hooked) is None
    meta = torch.nn.Linear(2, 2, device="meta")
    assert module_targets(meta) is None


def test_a_damaged_value_still_fails_naming_its_key(tmp_path):
    from integration_helpers.common import damage_value
    from shardpoint.errors import ChecksumMismatchError

    p = _save({"w": torch.randn(256, 256)}, tmp_path)
    damage_value(p, "w")
    with pytest.raises(ChecksumMismatchError, match="w"):
        load_tree(p, integration="test", into={"w": torch.zeros(256, 256)})


@pytest.mark.parametrize("compression", ["zstd", None])
def test_values_without_a_live_tensor_come_back_exact_in_the_same_read(tmp_path, compression):
    g = torch.Generator().manual_seed(3)
    saved = {
        "f32": torch.randn(300, 7, generator=g),
        "bf16": torch.randn(9, generator=g).to(torch.bfloat16),
        "f8": torch.randn(33, generator=g).to(torch.float8_e4m3fn),
        "step": torch.tensor(12),
        "mask": torch.rand(5, generator=g) > 0.5,
        "none": torch.zeros(0, 3),
        "live": torch.randn(4, generator=g),
    }
    p = str(tmp_path / "c")
    spt.save(saved, p, durable=False, compression=compression)
    live = torch.zeros(4)
    out = load_tree(p, integration="test", into={"live": live})
    assert out["live"] is live
    for k, v in saved.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert bits(out[k]) == bits(v), k
