"""Plain PyTorch (and DCP users' own loops) with the tiers: ``sp.CheckpointManager(...,
local_directory=...)`` over ``sp.Checkpoint(model=..., optimizer=...)``, restored exactly from
the local tier and, after it was wiped, from the persistent tier."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    return model, opt


def _step(model, opt, step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 8, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())
    opt.zero_grad()
    loss.backward()
    opt.step()


def _snapshot(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()},
    )


def _same(a, b):
    assert a[0].keys() == b[0].keys() and a[1].keys() == b[1].keys()
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert all(torch.equal(a[1][k][n], b[1][k][n]) for k in a[1] for n in a[1][k])


def test_model_and_optimizer_restore_from_local_then_persistent(tmp_path):
    model, opt = _setup()
    manager = sp.CheckpointManager(
        sp.Checkpoint(model=model, optimizer=opt),
        tmp_path / "bucket",
        local_directory=tmp_path / "nvme",
        local_every=4,
        persistent_every=8,
    )
    assert manager.restore_or_initialize() is None
    seen = {}
    for step in range(1, 13):
        _step(model, opt, step)
        manager.save(step)
        if step in (8, 12):
            seen[step] = _snapshot(model, opt)
    manager.close()

    for wipe, expected in ((False, 12), (True, 8)):
        if wipe:
            shutil.rmtree(tmp_path / "nvme")
        model2, opt2 = _setup()
        _step(model2, opt2, 99)  # other values, and optimizer state to overwrite
        m2 = sp.CheckpointManager(
            sp.Checkpoint(model=model2, optimizer=opt2),
            tmp_path / "bucket",
            local_directory=tmp_path / "nvme",
        )
        assert m2.restore_or_initialize() == expected
        assert [s.tier for s in m2.restore_plan().sources] == ["persistent" if wipe else "local"]
        _same(_snapshot(model2, opt2), seen[expected])
        m2.close()
