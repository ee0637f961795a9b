"""Issue 25: ``sp.Checkpoint(...).read/restore`` decodes plain CPU parameters, buffers and
existing optimizer state straight into their memory (one batched read at the end of the
restore call) instead of reading each value and copying it in; tensors it cannot write
directly (non-contiguous, other dtype refused as before) keep the copy."""

from __future__ import annotations

import pytest
import torch

import shardpoint as sp
import shardpoint.torch  # noqa: F401 - registers the torch adapters
from integration_helpers.common import ParameterCopies, bits, damage_value


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _step(net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    net(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_restore_writes_parameters_and_optimizer_state_in_place(tmp_path):
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    _step(net, opt)
    path = sp.Checkpoint(net=net, optimizer=opt).write(str(tmp_path / "ck"))
    saved = {k: bits(v) for k, v in net.state_dict().items()}
    saved_opt = {
        (p, k): bits(v) for p, s in opt.state_dict()["state"].items() for k, v in s.items()
    }
    _step(net, opt)
    _step(net, opt)
    ptrs = {k: v.data_ptr() for k, v in net.state_dict().items()}
    opt_ptrs = {
        (p, k): v.data_ptr() for p, s in opt.state_dict()["state"].items() for k, v in s.items()
    }
    with ParameterCopies(net.parameters()) as copies:
        sp.Checkpoint(net=net, optimizer=opt).read(path).assert_consumed()
    assert {k: v.data_ptr() for k, v in net.state_dict().items()} == ptrs
    assert {k: bits(v) for k, v in net.state_dict().items()} == saved
    state = opt.state_dict()["state"]
    assert {(p, k): v.data_ptr() for p, s in state.items() for k, v in s.items()} == opt_ptrs
    assert {(p, k): bits(v) for p, s in state.items() for k, v in s.items()} == saved_opt
    assert copies.from_elsewhere == [] and copies.into_params == 0


def test_tensors_that_cannot_be_written_directly_still_restore(tmp_path):
    net = _net()
    path = sp.Checkpoint(net=net).write(str(tmp_path / "ck"))
    other = _net()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    # a transposed (non-contiguous) parameter: restored through copy_, values exact
    w = other[0].weight
    other[0].weight = torch.nn.Parameter(torch.zeros(16, 32).t())
    assert not other[0].weight.is_contiguous() and w.shape == other[0].weight.shape
    sp.Checkpoint(net=other).read(path).assert_consumed()
    for (k, a), b in zip(net.state_dict().items(), other.state_dict().values(), strict=True):
        assert bits(a) == bits(b.contiguous()), k


def test_a_damaged_value_fails_the_restore_naming_its_key(tmp_path):
    from shardpoint.errors import ChecksumMismatchError

    net = torch.nn.Linear(256, 256)
    path = sp.Checkpoint(net=net).write(str(tmp_path / "ck"))
    key = next(k for k in sp.open(path).keys() if "weight" in k)
    damage_value(path, key)
    with pytest.raises(ChecksumMismatchError, match="weight"):
        sp.Checkpoint(net=torch.nn.Linear(256, 256)).read(path)
