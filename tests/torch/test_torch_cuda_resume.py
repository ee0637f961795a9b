"""Issue 22 on a CUDA device: a user's module subclass with fused/capturable/foreach optimizers
resumes bit for bit, every slot back on the device torch keeps it on (skipped without a GPU)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import shardpoint as sp  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)"
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


OPTIMIZERS = {
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=0.01, fused=True),
    "adamw_capturable": lambda p: torch.optim.AdamW(p, lr=0.01, capturable=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
}


def _build(make_opt, seed):
    torch.manual_seed(seed)
    model = Net().cuda()
    opt = make_opt(model.parameters())
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)


def _step(model, opt, sched, i):
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(8, 16, generator=g).cuda(), torch.randn(8, 4, generator=g).cuda()
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
    sched.step()


def _snapshot(model, opt):
    values, devices = [p.detach().clone() for p in model.parameters()], []
    for p in model.parameters():
        for key in sorted(opt.state[p]):
            values.append(opt.state[p][key].clone())
            devices.append((key, opt.state[p][key].device.type))
    return values, devices


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_cuda_resume_is_bit_for_bit(tmp_path, kind):
    model, opt, sched = _build(OPTIMIZERS[kind], 0)
    for i in range(3):
        _step(model, opt, sched, i)
    ckpt = sp.Checkpoint(model=model, optimizer=opt, scheduler=sched)
    path = sp.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2).save()
    slots = [k for k, _ in sp.list_variables(path) if ".OPTIMIZER_SLOT/" in k]
    assert len(slots) == 4 * (1 if kind == "sgd_momentum" else 3)
    for i in range(3, 6):
        _step(model, opt, sched, i)
    straight = _snapshot(model, opt)

    model2, opt2, sched2 = _build(OPTIMIZERS[kind], 1)
    sp.Checkpoint(model=model2, optimizer=opt2, scheduler=sched2).restore(path).assert_consumed()
    for i in range(3, 6):
        _step(model2, opt2, sched2, i)
    resumed = _snapshot(model2, opt2)
    assert resumed[1] == straight[1]  # `step` on the CPU unless capturable/fused, as torch
    assert all(torch.equal(a, b) for a, b in zip(straight[0], resumed[0], strict=True))
    assert sched2.state_dict() == sched.state_dict()
    assert os.listdir(tmp_path)
