"""The 'Training checkpoints' guide flow end to end, with numpy objects only.

A model with a lazily built Dense layer, a tiny numpy Adam with slots, a data iterator whose
position is saved, a CheckpointManager(max_to_keep=3); then the guide's partial restore through
stand-in objects, the deferred kernel restore, the list/dict example, lazy reading, and the
adapter hook for foreign objects.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from shardpoint.objgraph import storage_io
from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.checkpoint_reader import list_variables, load_checkpoint
from shardpoint.objgraph.manager import CheckpointManager
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.state_dict_adapter import StateDictTrackable
from shardpoint.objgraph.trackable import (
    Trackable,
    ValueSpec,
    register_trackable_adapter,
    unregister_trackable_adapter,
)
from shardpoint.objgraph.variables import SlotProvider, Variable

F32 = np.float32


class Dense(Module):
    def __init__(self, units, seed=0):
        self.units = units
        self.seed = seed

    def __call__(self, x):
        if not hasattr(self, "kernel"):  # built lazily, restored on creation
            rng = np.random.default_rng(self.seed)
            limit = np.sqrt(6.0 / (x.shape[-1] + self.units))
            self.add_variable(
                "kernel",
                (x.shape[-1], self.units),
                initializer=lambda s, d: rng.uniform(-limit, limit, s).astype(d),
            )
            self.add_variable("bias", (self.units,))
        return x @ self.kernel.value() + self.bias.value()


class Net(Module):
    def __init__(self):
        self.l1 = Dense(5)

    def __call__(self, x):
        return self.l1(x)


class Adam(SlotProvider, Module):
    """Legacy-Keras-style Adam: iter/beta_1/beta_2/decay/learning_rate plus m, v slots."""

    def __init__(self, learning_rate=0.1):
        self.iter = Variable(np.int64(0), name="iter")
        self.beta_1 = Variable(F32(0.9), name="beta_1")
        self.beta_2 = Variable(F32(0.999), name="beta_2")
        self.decay = Variable(F32(0.0), name="decay")
        self.learning_rate = Variable(F32(learning_rate), name="learning_rate")

    def apply_gradients(self, grads_and_vars):
        self.iter.assign_add(1)
        t = F32(int(self.iter))
        b1, b2, lr = self.beta_1.value(), self.beta_2.value(), self.learning_rate.value()
        for grad, var in grads_and_vars:
            m, v = self.add_slot(var, "m"), self.add_slot(var, "v")
            m.assign(b1 * m.value() + (F32(1) - b1) * grad)
            v.assign(b2 * v.value() + (F32(1) - b2) * grad * grad)
            lr_t = lr * np.sqrt(F32(1) - b2**t) / (F32(1) - b1**t)
            var.assign(var.value() - lr_t * m.value() / (np.sqrt(v.value()) + F32(1e-7)))


class DataIterator:
    """Repeating batches of 2 over the toy dataset; its position is its state."""

    def __init__(self):
        inputs = np.arange(10, dtype=F32)[:, None]
        self.inputs = inputs
        self.labels = inputs * F32(5) + np.arange(5, dtype=F32)[None, :]
        self.position = 0

    def __next__(self):
        idx = [(self.position + i) % 10 for i in range(2)]
        self.position += 2
        return self.inputs[idx], self.labels[idx]

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = int(state["position"])


def train_step(net, opt, x, y):
    out = net(x)
    loss = np.mean(np.abs(out - y))
    d = np.sign(out - y).astype(F32) / F32(out.size)
    grads = [(x.T @ d, net.l1.kernel), (d.sum(axis=0), net.l1.bias)]
    opt.apply_gradients(grads)
    return float(loss)


def build_program():
    net, opt, iterator = Net(), Adam(0.1), DataIterator()
    ckpt = Checkpoint(step=Variable(np.int32(0)), optimizer=opt, net=net, iterator=iterator)
    return net, opt, iterator, ckpt


def train_and_checkpoint(directory, steps, losses):
    net, opt, iterator, ckpt = build_program()
    manager = CheckpointManager(ckpt, directory, max_to_keep=3)
    ckpt.restore(manager.latest_checkpoint)
    for _ in range(steps):
        x, y = next(iterator)
        losses.append(train_step(net, opt, x, y))
        ckpt.step.assign_add(1)
        if int(ckpt.step) % 10 == 0:
            manager.save()
    return net, manager


def test_guide_flow_resumes_exactly(tmp_path, monkeypatch):
    """Two runs of 50 steps with a restore in between == one uninterrupted run of 100."""
    monkeypatch.chdir(tmp_path)
    interrupted: list[float] = []
    train_and_checkpoint("./tf_ckpts", 50, interrupted)
    net, manager = train_and_checkpoint("./tf_ckpts", 50, interrupted)
    straight: list[float] = []
    ref_net, _ = train_and_checkpoint("./straight", 100, straight)
    assert interrupted == straight
    np.testing.assert_array_equal(net.l1.kernel.numpy(), ref_net.l1.kernel.numpy())
    assert interrupted[-1] < interrupted[0] / 5  # it actually learned
    assert manager.checkpoints == ["./tf_ckpts/ckpt-8", "./tf_ckpts/ckpt-9", "./tf_ckpts/ckpt-10"]
    assert sorted(n.split(".")[0] for n in os.listdir("tf_ckpts")) == sorted(
        ["checkpoint"] + [f"ckpt-{i}" for i in (8, 9, 10) for _ in (0, 1)]
    )
    listing = dict(list_variables(manager.latest_checkpoint))
    slot = ".OPTIMIZER_SLOT/optimizer"
    expected = {
        "net/l1/bias/.ATTRIBUTES/VARIABLE_VALUE": [5],
        f"net/l1/bias/{slot}/m/.ATTRIBUTES/VARIABLE_VALUE": [5],
        f"net/l1/bias/{slot}/v/.ATTRIBUTES/VARIABLE_VALUE": [5],
        "net/l1/kernel/.ATTRIBUTES/VARIABLE_VALUE": [1, 5],
        f"net/l1/kernel/{slot}/m/.ATTRIBUTES/VARIABLE_VALUE": [1, 5],
        f"net/l1/kernel/{slot}/v/.ATTRIBUTES/VARIABLE_VALUE": [1, 5],
        "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE": [],
        "optimizer/learning_rate/.ATTRIBUTES/VARIABLE_VALUE": [],
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE": [],
        "step/.ATTRIBUTES/VARIABLE_VALUE": [],
        "iterator/.ATTRIBUTES/position": [],
    }
    assert all(listing[k] == shape for k, shape in expected.items())
    with load_checkpoint("./tf_ckpts") as reader:
        assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 100
        assert reader.get_tensor("iterator/.ATTRIBUTES/position") == 200


def saved_guide_checkpoint(tmp_path):
    losses: list[float] = []
    net, manager = train_and_checkpoint(str(tmp_path / "ck"), 20, losses)
    return net, manager.latest_checkpoint


def test_guide_partial_restore_through_stand_ins(tmp_path):
    """Only the bias, via fake_layer/fake_net/new_root (ST-04 in the guide's own terms)."""
    net, path = saved_guide_checkpoint(tmp_path)
    to_restore = Variable(np.zeros(5, F32))
    fake_layer = Checkpoint(bias=to_restore)
    fake_net = Checkpoint(l1=fake_layer)
    new_root = Checkpoint(net=fake_net)
    status = new_root.restore(path)
    np.testing.assert_array_equal(to_restore.numpy(), net.l1.bias.numpy())
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match=r"\(root\)\.iterator"):
        status.assert_consumed()
    # the deferred kernel restore: attaching a kernel to the stand-in layer restores it
    fake_layer.kernel = Variable(np.zeros((1, 5), F32))
    np.testing.assert_array_equal(fake_layer.kernel.numpy(), net.l1.kernel.numpy())
    status.expect_partial()


def test_guide_list_dict_example(tmp_path):
    """The guide's list/dict example: deferred dict key and list append restores."""
    save = Checkpoint()
    save.listed = [Variable(F32(1.0))]
    save.listed.append(Variable(F32(2.0)))
    save.mapped = {"one": save.listed[0]}
    save.mapped["two"] = save.listed[1]
    save_path = save.save(tmp_path / "tf_list_example")
    restore = Checkpoint()
    v2 = Variable(F32(0.0))
    restore.mapped = {"two": v2}
    restore.restore(save_path)
    assert float(v2) == 2.0
    restore.listed = []
    v1 = Variable(F32(0.0))
    restore.listed.append(v1)
    assert float(v1) == 1.0
    assert list(restore.mapped) == ["two"] and restore.mapped["two"] is v2


class CountingReader:
    """Wraps the lazy reader and records which keys were inspected or read."""

    def __init__(self, inner, log):
        self._inner, self._log = inner, log

    def __getitem__(self, key):
        self._log.append(key)
        return self._inner[key]

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __contains__(self, key):
        return key in self._inner


def test_restore_reads_only_matching_tensors(tmp_path, monkeypatch):
    """Item 8: restoring one variable of a big checkpoint reads only that tensor."""
    big = Module()
    big.layers = [Variable(np.full((64, 64), i, F32)) for i in range(100)]
    path = Checkpoint(model=big).write(tmp_path / "big")
    log: list[str] = []
    real_open = storage_io.open_reader
    monkeypatch.setattr(
        storage_io, "open_reader", lambda p, *a: CountingReader(real_open(p, *a), log)
    )
    layers = Module()
    layers.layers = []
    status = Checkpoint(model=layers).read(path)
    assert log == ["_CHECKPOINTABLE_OBJECT_GRAPH"]
    layers.layers.append(Variable(np.zeros((64, 64), F32)))
    assert log == ["_CHECKPOINTABLE_OBJECT_GRAPH", "model/layers/0/.ATTRIBUTES/VARIABLE_VALUE"]
    assert float(layers.layers[0].numpy()[0, 0]) == 0.0
    layers.layers.append(Variable(np.zeros((64, 64), F32)))
    assert float(layers.layers[1].numpy()[3, 3]) == 1.0 and len(log) == 3
    status.expect_partial()


# --- adapter hook (for torch in issue 5, shown here with a foreign numpy-holding class) ------


class ForeignParam:
    """Not a Trackable: some other framework's parameter holding a buffer."""

    def __init__(self, data):
        self.data = np.asarray(data, F32)


class ForeignAdapter(Trackable):
    def __init__(self, param):
        self.param = param

    def _sp_values(self):
        return {"VARIABLE_VALUE": self.param.data}

    def _sp_value_specs(self):
        return {"VARIABLE_VALUE": ValueSpec(self.param.data.shape, self.param.data.dtype.name)}

    def _sp_restore_values(self, values):
        self.param.data[...] = values["VARIABLE_VALUE"]  # in place, into the foreign storage


@pytest.fixture
def foreign_adapter():
    register_trackable_adapter(ForeignParam, ForeignAdapter)
    yield
    unregister_trackable_adapter(ForeignAdapter)


def test_adapter_hook_saves_shares_and_restores_in_place(tmp_path, foreign_adapter):
    p = ForeignParam([1.0, 2.0])
    m = Module()
    m.a = p
    m.b = p  # same foreign object -> same adapter -> saved once
    assert m.a is p  # the attribute keeps the foreign object
    path = Checkpoint(m=m, direct=ForeignParam([5.0])).write(tmp_path / "f")
    keys = [k for k, _ in list_variables(path)]
    assert "m/a/.ATTRIBUTES/VARIABLE_VALUE" in keys and not any(k.startswith("m/b") for k in keys)
    q = ForeignParam([0.0, 0.0])
    buffer = q.data
    fresh = Module()
    status = Checkpoint(m=fresh, direct=ForeignParam([0.0])).read(path)
    fresh.a = q  # deferred restore through the adapter
    assert q.data is buffer and q.data.tolist() == [1.0, 2.0]
    fresh.b = q
    status.assert_consumed()


def test_state_dict_objects_round_trip_nested_state(tmp_path):
    """Objects with state_dict()/load_state_dict() are trackable: nested dicts, int keys."""

    class Sched:
        def __init__(self):
            self.state = {"step": 0, "name": "cosine", "hist": {3: np.zeros(2, F32)}, "ls": [1.5]}

        def state_dict(self):
            return self.state

        def load_state_dict(self, s):
            self.state = s

    s = Sched()
    s.state = {"step": 7, "name": "warm", "hist": {3: np.array([1, 2], F32)}, "ls": [2.5]}
    path = Checkpoint(sched=s).write(tmp_path / "s")
    fresh = Sched()
    Checkpoint(sched=fresh).read(path).assert_consumed()
    assert fresh.state["step"] == 7 and fresh.state["name"] == "warm" and fresh.state["ls"] == [2.5]
    assert list(fresh.state["hist"]) == [3] and fresh.state["hist"][3].tolist() == [1.0, 2.0]


def test_torch_module_through_registered_state_dict_adapter(tmp_path):
    torch = pytest.importorskip("torch")

    def factory(module):
        return StateDictTrackable(
            module, to_numpy=lambda t: t.detach().cpu().numpy(), from_numpy=torch.from_numpy
        )

    register_trackable_adapter(torch.nn.Module, factory)
    try:
        torch.manual_seed(0)
        src = torch.nn.Linear(3, 2)
        path = Checkpoint(layer=src).write(tmp_path / "t")
        dst = torch.nn.Linear(3, 2)
        Checkpoint(layer=dst).read(path).assert_consumed()
        assert torch.equal(src.weight, dst.weight) and torch.equal(src.bias, dst.bias)
    finally:
        unregister_trackable_adapter(factory)
