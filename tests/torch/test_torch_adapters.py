"""Plain PyTorch objects in sp.Checkpoint: the guide flow, stand-ins, optimizers, lazy modules."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402

SLOT = ".OPTIMIZER_SLOT/optimizer"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.LazyLinear(5)

    def forward(self, x):
        return self.l1(x)


class DataIterator:
    """Repeating batches of 2 over the guide's toy dataset; its position is its state."""

    def __init__(self):
        self.inputs = torch.arange(10, dtype=torch.float32)[:, None]
        self.labels = self.inputs * 5 + torch.arange(5, dtype=torch.float32)[None, :]
        self.position = 0

    def __next__(self):
        idx = [(self.position + i) % 10 for i in range(2)]
        self.position += 2
        return self.inputs[idx], self.labels[idx]

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = int(state["position"])


class BuiltNet(nn.Module):
    """Net with the layer already built (same checkpoint structure as Net)."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(1, 5)

    def forward(self, x):
        return self.l1(x)


def build_program(seed=0):
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    iterator = DataIterator()
    ckpt = sp.Checkpoint(step=sp.Variable(np.int32(0)), optimizer=opt, net=net, iterator=iterator)
    return net, opt, iterator, ckpt


def train_step(net, opt, x, y):
    opt.zero_grad()
    loss = (net(x) - y).abs().mean()
    loss.backward()
    opt.step()
    return loss.item()


def train_and_checkpoint(directory, steps, losses, seed=0):
    net, opt, iterator, ckpt = build_program(seed)
    manager = sp.CheckpointManager(ckpt, directory, max_to_keep=3)
    ckpt.restore(manager.latest_checkpoint)
    for _ in range(steps):
        x, y = next(iterator)
        losses.append(train_step(net, opt, x, y))
        ckpt.step.assign_add(1)
        if int(ckpt.step) % 10 == 0:
            manager.save()
    return net, opt, manager


def test_guide_flow_resumes_exactly(tmp_path, monkeypatch):
    """50 steps, rebuild everything fresh (other seed), restore, 50 more == 100 straight."""
    monkeypatch.chdir(tmp_path)
    interrupted: list[float] = []
    train_and_checkpoint("./ckpts", 50, interrupted)
    # a different seed: if anything were not restored the losses would differ
    net, opt, manager = train_and_checkpoint("./ckpts", 50, interrupted, seed=123)
    straight: list[float] = []
    ref_net, ref_opt, _ = train_and_checkpoint("./straight", 100, straight)
    assert interrupted == straight
    assert torch.equal(net.l1.weight, ref_net.l1.weight)
    assert interrupted[-1] < interrupted[0] / 5  # it learned
    assert manager.checkpoints == ["./ckpts/ckpt-8", "./ckpts/ckpt-9", "./ckpts/ckpt-10"]
    assert sorted(n.split(".")[0] for n in os.listdir("ckpts")) == sorted(
        ["checkpoint"] + [f"ckpt-{i}" for i in (8, 9, 10) for _ in (0, 1)]
    )
    listing = dict(sp.list_variables(manager.latest_checkpoint))
    expected = {
        "net/l1/weight/.ATTRIBUTES/VARIABLE_VALUE": [5, 1],
        "net/l1/bias/.ATTRIBUTES/VARIABLE_VALUE": [5],
        f"net/l1/weight/{SLOT}/exp_avg/.ATTRIBUTES/VARIABLE_VALUE": [5, 1],
        f"net/l1/weight/{SLOT}/exp_avg_sq/.ATTRIBUTES/VARIABLE_VALUE": [5, 1],
        f"net/l1/weight/{SLOT}/step/.ATTRIBUTES/VARIABLE_VALUE": [],
        f"net/l1/bias/{SLOT}/exp_avg/.ATTRIBUTES/VARIABLE_VALUE": [5],
        "optimizer/.ATTRIBUTES/param_groups": [],
        "iterator/.ATTRIBUTES/position": [],
        "step/.ATTRIBUTES/VARIABLE_VALUE": [],
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE": [],
    }
    for key, shape in expected.items():
        assert listing[key] == shape, key
    with sp.load_checkpoint(manager.latest_checkpoint) as reader:
        assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 100
        assert reader.get_tensor("iterator/.ATTRIBUTES/position") == 200
        step = reader.get_tensor(f"net/l1/bias/{SLOT}/step/.ATTRIBUTES/VARIABLE_VALUE")
        assert float(step) == 100.0
    # the restored optimizer state equals the uninterrupted one, bit for bit
    for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], ref_opt.state[q][key])


@pytest.fixture
def saved(tmp_path):
    losses: list[float] = []
    net, opt, manager = train_and_checkpoint(str(tmp_path / "ck"), 20, losses)
    return net, opt, manager.latest_checkpoint


def test_partial_restore_of_the_bias_through_stand_ins(saved):
    net, _, path = saved
    to_restore = torch.zeros(5)
    fake_layer = sp.Checkpoint(bias=to_restore)
    fake_net = sp.Checkpoint(l1=fake_layer)
    new_root = sp.Checkpoint(net=fake_net)
    status = new_root.restore(path)
    assert torch.equal(to_restore, net.l1.bias.detach())
    status.assert_existing_objects_matched()
    status.assert_nontrivial_match()
    with pytest.raises(AssertionError, match=r"\(root\)\.iterator"):
        status.assert_consumed()
    # deferred restore: attaching the kernel to the stand-in restores it
    fake_layer.weight = torch.zeros(5, 1)
    assert torch.equal(fake_layer.weight, net.l1.weight.detach())
    status.expect_partial()


def test_full_restore_into_built_objects_is_consumed_and_in_place(saved):
    net, opt, path = saved
    net2 = BuiltNet()
    weight = net2.l1.weight
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.5)
    ckpt = sp.Checkpoint(
        step=sp.Variable(np.int32(0)), optimizer=opt2, net=net2, iterator=DataIterator()
    )
    status = ckpt.restore(path)
    status.assert_consumed()
    assert net2.l1.weight is weight  # restored in place, the optimizer still holds it
    assert torch.equal(weight, net.l1.weight)
    assert opt2.param_groups[0]["lr"] == 0.1 and opt2.param_groups[0]["betas"] == (0.9, 0.999)
    for p, q in zip(net.parameters(), net2.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])
        assert opt2.state[q]["step"].device.type == "cpu"


def continue_training(net, opt, steps=5):
    iterator = DataIterator()
    return [train_step(net, opt, *next(iterator)) for _ in range(steps)]


@pytest.mark.parametrize("when", ["after_first_step", "attached_after_restore"])
def test_optimizer_restore_variants(saved, when):
    net, opt, path = saved
    reference = continue_training(*_clone(net, opt, path)) if when == "after_first_step" else None
    net2 = BuiltNet()
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.5)
    if when == "after_first_step":
        continue_training(net2, opt2, steps=1)  # state exists: the restore overwrites in place
        exp_avg = opt2.state[net2.l1.weight]["exp_avg"]
        status = sp.Checkpoint(net=net2, optimizer=opt2).read(path)
        assert opt2.state[net2.l1.weight]["exp_avg"] is exp_avg
        assert continue_training(net2, opt2) == reference
    else:
        ckpt = sp.Checkpoint(net=net2)
        status = ckpt.read(path)
        assert not opt2.state
        ckpt.optimizer = opt2  # deferred: slots are created when the optimizer is attached
        assert opt2.param_groups[0]["lr"] == 0.1
        for p, q in zip(net.parameters(), net2.parameters(), strict=True):
            assert torch.equal(opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"])
    status.expect_partial()


def _clone(net, opt, path):
    """A fresh copy of (net, opt) restored from ``path`` (the reference continuation)."""
    net2 = BuiltNet()
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.5)
    sp.Checkpoint(net=net2, optimizer=opt2).read(path).expect_partial()
    return net2, opt2


def test_lazy_module_materializes_with_checkpoint_values(saved):
    net, _, path = saved
    fresh = Net()
    status = sp.Checkpoint(net=fresh).read(path)
    assert nn.parameter.is_lazy(fresh.l1.weight)
    x = torch.arange(4, dtype=torch.float32)[:, None]
    out = fresh(x)  # the forward pre-hook restores right after materialization
    assert torch.equal(out, net(x))
    assert torch.equal(fresh.l1.bias, net.l1.bias)
    status.expect_partial()
    # materialized without a forward: run_deferred_restores applies the pending values
    other = Net()
    status = sp.Checkpoint(net=other).read(path)
    other.l1.initialize_parameters(x)
    spt.run_deferred_restores(other)
    assert torch.equal(other.l1.weight, net.l1.weight)
    status.expect_partial()


def test_tensors_and_parameters_are_trackable_values(tmp_path):
    bias = torch.arange(3.0)
    param = nn.Parameter(torch.ones(2, 2))
    half = torch.full((4,), 1.5, dtype=torch.bfloat16)
    path = sp.Checkpoint(bias=bias, param=param, half=half).write(tmp_path / "t")
    assert dict(sp.list_variables(path))["bias/.ATTRIBUTES/VARIABLE_VALUE"] == [3]
    b2, p2, h2 = (
        torch.zeros(3),
        nn.Parameter(torch.zeros(2, 2)),
        torch.zeros(4, dtype=torch.bfloat16),
    )
    ptr = b2.data_ptr()
    sp.Checkpoint(bias=b2, param=p2, half=h2).read(path).assert_consumed()
    assert b2.data_ptr() == ptr and torch.equal(b2, bias)
    assert torch.equal(p2, param) and p2.requires_grad and torch.equal(h2, half)
    with pytest.raises(sp.ShapeMismatchError, match="bias"):
        sp.Checkpoint(bias=torch.zeros(4)).read(path)
    with pytest.raises(sp.DTypeMismatchError):
        sp.Checkpoint(bias=torch.zeros(3, dtype=torch.float64)).read(path)


def test_module_structure_buffers_tied_weights_and_sp_attributes(tmp_path):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 3)
            self.blocks = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
            self.head = nn.Linear(3, 7, bias=False)
            self.head.weight = self.emb.weight  # tied
            self.register_buffer("scratch", torch.zeros(2), persistent=False)
            self.counter = sp.Variable(np.int64(4))

    torch.manual_seed(1)
    m = Model()
    m.blocks[1].running_mean.fill_(0.5)
    path = sp.Checkpoint(model=m).write(tmp_path / "m")
    keys = [k for k, _ in sp.list_variables(path)]
    assert "model/emb/weight/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "model/blocks/1/running_mean/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "model/blocks/1/num_batches_tracked/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "model/counter/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert not any(k.startswith("model/head/weight") or "scratch" in k for k in keys)
    torch.manual_seed(2)
    m2 = Model()
    m2.counter.assign(0)
    sp.Checkpoint(model=m2).read(path).assert_consumed()
    for (n, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert m2.head.weight is m2.emb.weight and int(m2.counter) == 4


def test_state_dict_objects_scheduler_scaler_and_tensor_state(tmp_path):
    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=1.0, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    class Sampler:
        """A stateful data source whose state holds a tensor (a torch.Generator state)."""

        def __init__(self):
            self.gen = torch.Generator().manual_seed(0)

        def state_dict(self):
            return {"rng": self.gen.get_state(), "epoch": 3}

        def load_state_dict(self, state):
            assert isinstance(state["rng"], torch.Tensor)
            self.gen.set_state(state["rng"])

    sampler = Sampler()
    for _ in range(5):
        opt.zero_grad()
        net(torch.ones(1, 2)).sum().backward()
        opt.step()
        sched.step()
    torch.randn(3, generator=sampler.gen)
    path = sp.Checkpoint(net=net, opt=opt, sched=sched, scaler=scaler, sampler=sampler).write(
        tmp_path / "s"
    )
    net2 = nn.Linear(2, 2)
    opt2 = torch.optim.SGD(net2.parameters(), lr=1.0, momentum=0.9)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    scaler2 = torch.amp.GradScaler("cpu", init_scale=1.0)
    sampler2 = Sampler()
    ckpt = sp.Checkpoint(net=net2, opt=opt2, sched=sched2, scaler=scaler2, sampler=sampler2)
    ckpt.read(path).assert_consumed()
    assert sched2.state_dict() == sched.state_dict()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.25
    assert scaler2.get_scale() == 1024.0
    assert torch.equal(
        torch.randn(3, generator=sampler2.gen), torch.randn(3, generator=sampler.gen)
    )
    for p, q in zip(net.parameters(), net2.parameters(), strict=True):
        assert torch.equal(opt.state[p]["momentum_buffer"], opt2.state[q]["momentum_buffer"])


def test_torch_adapters_load_without_importing_shardpoint_torch():
    """A plain ``sp.Checkpoint(model=net)`` in a fresh process, without ``import
    shardpoint.torch``, must use the torch adapters' keys (not the generic state-dict ones)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import os, tempfile
        import torch
        import shardpoint as sp
        net = torch.nn.Linear(2, 3)
        p = sp.Checkpoint(model=net).write(os.path.join(tempfile.mkdtemp(), "c"))
        print(sorted(k for k, _ in sp.list_variables(p)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "model/weight/.ATTRIBUTES/VARIABLE_VALUE" in out.stdout, out.stdout + out.stderr
    assert "model/bias/.ATTRIBUTES/VARIABLE_VALUE" in out.stdout
