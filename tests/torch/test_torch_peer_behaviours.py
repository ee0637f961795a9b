"""Peers' behaviours for PyTorch objects (issue 22): a weakly referenced root keeps nothing
alive, a deferred restore keeps no file open, tied parameters refuse two different values."""

from __future__ import annotations

import gc
import os
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402


def _open_files(directory: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(directory):
            out.append(target)
    return out


def test_weakref_root_keeps_nothing_alive_after_del(tmp_path):
    """TensorFlow's test_weakref_root with a torch module: after ``del root`` only the test's
    own reference holds the restored parameter, without waiting for the cyclic collector,
    also while part of the checkpoint waits (deferred) for an object the module lacks."""
    src = nn.Module()
    src.w = nn.Parameter(torch.ones(3))
    src.extra = nn.Linear(2, 2)  # the restored module has no `extra`: its values are parked
    path = sp.Checkpoint(root=src).save(str(tmp_path / "ckpt"))

    gc.disable()  # a reference cycle must not be hidden by a collection at a lucky moment
    try:
        root = nn.Module()
        root.w = nn.Parameter(torch.zeros(3))
        ref = root.w
        ckpt = sp.Checkpoint(root=weakref.ref(root))
        status = ckpt.restore(path)
        assert torch.equal(ref, torch.ones(3))
        probe = weakref.ref(root)
        del root
        assert probe() is None
        assert sys.getrefcount(ref) == 2  # `ref` and getrefcount's argument
        del status
        assert sys.getrefcount(ref) == 2
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="garbage-collected"):
        ckpt.save(str(tmp_path / "again"))


def test_deferred_restore_into_lazy_module_keeps_no_file_open(tmp_path):
    """TensorFlow's test_ckpt_files_closed_after_restoration with lazy modules: the values
    wait for the first forward, the files are closed as soon as restore() returns."""
    torch.manual_seed(0)
    src = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    path = sp.Checkpoint(model=src).save(str(tmp_path / "ckpt"))
    model = nn.Sequential(nn.LazyLinear(4), nn.LazyLinear(2))
    status = sp.Checkpoint(model=model).restore(path)
    gc.collect()
    assert _open_files(str(tmp_path)) == []
    model(torch.ones(1, 3))  # materializes, then restores (reopening the files meanwhile)
    gc.collect()
    assert _open_files(str(tmp_path)) == []
    for a, b in zip(model.parameters(), src.parameters(), strict=True):
        assert torch.equal(a, b)
    status.assert_consumed()
    assert isinstance(sp.objgraph.trackable.as_trackable(model), spt.ModuleAdapter)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2, bias=False)
        self.b = nn.Linear(2, 2, bias=False)
        self.b.weight = self.a.weight  # one parameter, two names


class _TwoTiedGroups(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = self.a  # weight and bias: two tied groups


class _Untied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)


def test_tied_conflicts_are_listed_as_safetensors_lists_them(tmp_path):
    """safetensors' test_difference_torch_odd case: an untied model's file loaded into the tied
    one. safetensors lists the names it cannot load as unexpected, sorted ("b.bias" before
    "b.weight", not the model's order); our message is exactly its message, then why."""
    st = pytest.importorskip("safetensors.torch")
    src = _Untied()
    spt.save_model(src, tmp_path / "ck")
    st.save_model(src, str(tmp_path / "ck.safetensors"))
    with pytest.raises(RuntimeError) as theirs:
        st.load_model(_TwoTiedGroups(), str(tmp_path / "ck.safetensors"))
    assert 'Unexpected key(s) in state_dict: "b.bias", "b.weight"' in str(theirs.value)
    for load in (spt.load_model, spt.load_into):
        with pytest.raises(spt.TiedWeightsConflictError) as ours:
            load(_TwoTiedGroups(), tmp_path / "ck")
        assert str(ours.value).startswith(str(theirs.value) + "\n    Tied weights: "), load


def test_load_model_refuses_two_different_values_for_one_tied_parameter(tmp_path):
    """safetensors.torch.load_model raises for the same file (strict); torch's
    load_state_dict would silently keep the value it copies last."""
    st = pytest.importorskip("safetensors.torch")
    first, second = torch.ones(2, 2), torch.full((2, 2), 2.0)
    spt.save({"a.weight": first, "b.weight": second}, tmp_path / "ck")
    st.save_file({"a.weight": first, "b.weight": second}, str(tmp_path / "ck.safetensors"))
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "b.weight"'):
        st.load_model(Tied(), str(tmp_path / "ck.safetensors"))  # the peer's behaviour
    model = Tied()
    before = model.a.weight.detach().clone()
    for load in (spt.load_model, spt.load_into):
        with pytest.raises(spt.TiedWeightsConflictError) as info:
            load(model, tmp_path / "ck")
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, sp.CheckpointError)
        assert 'Unexpected key(s) in state_dict: "b.weight"' in str(info.value)
        assert '"a.weight" and "b.weight"' in str(info.value)
        assert torch.equal(model.a.weight, before)  # nothing was loaded
    for load in (spt.load_model, spt.load_into):
        model = Tied()
        assert load(model, tmp_path / "ck", strict=False) == ([], ["b.weight"])
        assert torch.equal(model.a.weight, first) and model.b.weight is model.a.weight


def test_load_model_accepts_equal_values_for_one_tied_parameter(tmp_path):
    weight = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    spt.save({"a.weight": weight, "b.weight": weight.clone()}, tmp_path / "ck")
    for load in (spt.load_model, spt.load_into):
        model = Tied()
        assert load(model, tmp_path / "ck") == ([], [])
        assert torch.equal(model.a.weight, weight) and model.b.weight is model.a.weight
