"""Issue 22: whatever a user tracks is saved completely, whatever they imported and in what order.

The README's own example (a user's ``nn.Module`` subclass + Adam, only ``import shardpoint``)
used to save no Adam moments: the torch adapters were registered too late for a class defined
outside torch, so the model got the generic ``state_dict()`` adapter and the optimizer's slots
had no parameter to hang on. Each import order runs in a fresh interpreter (the bug only shows
before ``shardpoint.torch`` is imported), looping over {user subclass, nn.Sequential, bare
nn.Linear} x {Adam + StepLR, AdamW + CosineAnnealingLR, SGD with momentum + ExponentialLR}:
every optimizer state key is in the checkpoint's key listing, and restoring into fresh objects
then training on is bit for bit the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_IMPORTS = {
    # the README: `import shardpoint as sp, torch`; shardpoint.torch is never named
    "shardpoint_only": "import shardpoint as sp\nimport torch\n",
    "shardpoint_torch_first": "import shardpoint.torch\nimport shardpoint as sp\nimport torch\n",
    "torch_first": "import torch\nimport shardpoint as sp\n",
}

_MATRIX = textwrap.dedent(
    """
    import json, os, sys, tempfile
    # what `import shardpoint` alone loads: never torch, never the torch adapters
    IMPORT_ORDER = sys.argv[1]
    if IMPORT_ORDER == "shardpoint_only":
        assert "shardpoint.torch" not in sys.modules, "import shardpoint imported shardpoint.torch"

    # the first lookups race from several threads (a data loader thread, an async save):
    # none may see the generic state_dict() adapter while shardpoint.torch is being imported
    import threading

    class FirstLookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

    barrier = threading.Barrier(8)
    first_kinds = []

    def first_lookup():
        module = FirstLookup()
        barrier.wait()
        first_kinds.append(type(sp.objgraph.trackable.as_trackable(module)).__name__)

    threads = [threading.Thread(target=first_lookup) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    class UserAdapterModule(torch.nn.Module):
        pass

    class UserAdapter(sp.Trackable):
        def __init__(self, obj):
            self.obj = obj

    # registered before the torch adapters are loaded (except in shardpoint_torch_first):
    # a user's adapter must still win over the built-in module adapter
    sp.register_trackable_adapter(UserAdapterModule, UserAdapter)

    class Net(torch.nn.Module):  # a user subclass, defined in __main__
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 6)
            self.head = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x)))

    MODELS = {
        "subclass": Net,
        "sequential": lambda: torch.nn.Sequential(
            torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)
        ),
        "linear": lambda: torch.nn.Linear(4, 3),
    }
    OPTIMIZERS = {
        "adam_steplr": (
            lambda p: torch.optim.Adam(p, lr=0.01),
            lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        ),
        "adamw_cosine": (
            lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5),
        ),
        "sgd_momentum_exp": (
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
            lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9),
        ),
    }

    def batch(i):
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)

    def step(model, opt, sched, i):
        x, y = batch(i)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        sched.step()

    def build(model_kind, opt_kind, seed):
        torch.manual_seed(seed)
        model = MODELS[model_kind]()
        make_opt, make_sched = OPTIMIZERS[opt_kind]
        opt = make_opt(model.parameters())
        return model, opt, make_sched(opt)

    def snapshot(model, opt, sched):
        tensors = [p.detach().clone() for p in model.parameters()]
        for p in model.parameters():
            for key in sorted(opt.state[p]):
                value = opt.state[p][key]
                tensors.append(value.clone() if torch.is_tensor(value) else torch.tensor(value))
        return tensors, sched.state_dict(), [g["lr"] for g in opt.param_groups]

    results = {}
    root = tempfile.mkdtemp()
    for model_kind in MODELS:
        for opt_kind in OPTIMIZERS:
            case = f"{model_kind}/{opt_kind}"
            model, opt, sched = build(model_kind, opt_kind, seed=0)
            for i in range(3):
                step(model, opt, sched, i)
            ckpt = sp.Checkpoint(model=model, optimizer=opt, scheduler=sched, step=sp.Variable(0))
            manager = sp.CheckpointManager(ckpt, os.path.join(root, case), max_to_keep=3)
            manager.save()
            listed = {k for k, _ in sp.list_variables(sp.latest_checkpoint(manager.directory))}
            expected = [
                "model/" + name.replace(".", "/") + "/.OPTIMIZER_SLOT/optimizer/"
                + key + "/.ATTRIBUTES/VARIABLE_VALUE"
                for name, p in model.named_parameters()
                for key in opt.state[p]
            ]
            for i in range(3, 6):  # the uninterrupted run goes on
                step(model, opt, sched, i)
            straight = snapshot(model, opt, sched)

            # fresh objects (another seed: anything not restored would differ)
            model2, opt2, sched2 = build(model_kind, opt_kind, seed=1)
            ckpt2 = sp.Checkpoint(
                model=model2, optimizer=opt2, scheduler=sched2, step=sp.Variable(0)
            )
            ckpt2.restore(sp.latest_checkpoint(os.path.join(root, case))).assert_consumed()
            for i in range(3, 6):
                step(model2, opt2, sched2, i)
            resumed = snapshot(model2, opt2, sched2)
            results[case] = {
                "expected_slot_keys": len(expected),
                "missing_keys": [k for k in expected if k not in listed],
                "slot_keys_listed": sum(".OPTIMIZER_SLOT/" in k for k in listed),
                "tensors_equal": len(straight[0]) == len(resumed[0]) and all(
                    torch.equal(a, b) for a, b in zip(straight[0], resumed[0])
                ),
                "scheduler_equal": straight[1] == resumed[1],
                "lr_equal": straight[2] == resumed[2],
            }
    results["first_lookup_kinds"] = sorted(set(first_kinds))
    results["user_adapter_wins"] = type(sp.objgraph.trackable.as_trackable(
        UserAdapterModule()
    )).__name__
    print("RESULT " + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def matrix_runs(tmp_path_factory):
    """Start the three fresh interpreters at once (most of their time is importing torch and
    torch._dynamo, which the first optimizer pulls in), then collect their outputs."""
    env = dict(os.environ, PYTHONPATH=os.path.join(_ROOT, "python"))
    procs = {}
    for order, imports in _IMPORTS.items():
        directory = tmp_path_factory.mktemp(order)
        script = directory / "matrix.py"
        script.write_text(imports + _MATRIX)
        procs[order] = subprocess.Popen(
            [sys.executable, str(script), order],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=directory,
        )
    outputs = {}
    for order, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        outputs[order] = (proc.returncode, stdout, stderr)
    return outputs


@pytest.mark.parametrize("order", sorted(_IMPORTS))
def test_every_optimizer_state_key_saved_and_resume_is_exact(order, matrix_runs):
    """3 models x 3 optimizer+scheduler pairs in one fresh interpreter per import order."""
    returncode, stdout, stderr = matrix_runs[order]
    assert returncode == 0, stdout + stderr
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    results = json.loads(line[len("RESULT ") :])
    assert results.pop("first_lookup_kinds") == ["ModuleAdapter"]
    assert results.pop("user_adapter_wins") == "UserAdapter"
    assert len(results) == 9
    for case, r in results.items():
        # Adam/AdamW: exp_avg, exp_avg_sq, step per parameter; SGD: momentum_buffer
        per_param = 1 if "sgd" in case else 3
        n_params = 2 if case.startswith("linear") else 4
        assert r["expected_slot_keys"] == per_param * n_params, (case, r)
        assert r["missing_keys"] == [], (case, r)
        assert r["slot_keys_listed"] == r["expected_slot_keys"], (case, r)
        assert r["tensors_equal"] and r["scheduler_equal"] and r["lr_equal"], (case, r)


def test_optimizer_alone_refuses_to_drop_its_state(tmp_path):
    """A torch optimizer whose parameters are not in the checkpoint would lose its moments:
    the save raises, naming the object path, before anything is written or counted."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    ckpt = sp.Checkpoint(optimizer=opt)
    directory = tmp_path / "run"
    manager = sp.CheckpointManager(ckpt, str(directory), max_to_keep=3)
    with pytest.raises(sp.UnsaveableObjectError, match=r"^\(root\)\.optimizer: Adam holds state"):
        manager.save()
    assert not any(n.startswith("ckpt") or n == "checkpoint" for n in os.listdir(directory))
    assert int(ckpt.save_counter) == 0  # the failed save gave its number back
    with pytest.raises(sp.UnsaveableObjectError, match="exp_avg_sq"):
        ckpt.write(str(tmp_path / "w"))
    assert not sp.exists(str(tmp_path / "w"))
    # the documented way to save an optimizer on its own: its state_dict()
    alone = sp.Checkpoint(optimizer=spt.TorchStateDictTrackable(opt))
    path = alone.write(str(tmp_path / "sd"))
    keys = {k for k, _ in sp.list_variables(path)}
    assert "optimizer/.ATTRIBUTES/state/0/exp_avg_sq" in keys
    # with the model, the same optimizer saves (and the counter starts from 1 again)
    with_model = sp.Checkpoint(optimizer=opt, model=model)
    assert with_model.save(str(tmp_path / "ok" / "c")).endswith("c-1")


def test_state_dict_object_with_an_unstorable_entry_raises_naming_it(tmp_path):
    """The generic state_dict() adapter met a value it could not store: the save names the
    object path and the entry, and writes nothing."""

    class Loader:
        def __init__(self):
            self.state = {"position": 3, "hook": lambda: None}  # sets are stored (§6.1)

        def state_dict(self):
            return self.state

        def load_state_dict(self, state):
            self.state = state

    ckpt = sp.Checkpoint(loader=Loader(), step=sp.Variable(1))
    with pytest.raises(
        sp.UnsaveableObjectError, match=r"^\(root\)\.loader: .*'hook' is a builtins.function"
    ):
        ckpt.save(str(tmp_path / "c"))
    assert os.listdir(tmp_path) == []
    assert int(ckpt.save_counter) == 0


class WithExtraState(nn.Module):
    """A module with torch's extra state (what quantization/fp8 modules keep beside their
    parameters): state_dict() saves it as "<module>._extra_state"."""

    def __init__(self, scale=0.0):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.calibration = {"scale": torch.tensor([scale]), "steps": int(scale), "mode": "amax"}

    def get_extra_state(self):
        return self.calibration

    def set_extra_state(self, state):
        self.calibration = state


def test_module_extra_state_is_saved_and_restored(tmp_path):
    """The module adapter used to skip get_extra_state(): a save silently held less than the
    module's own state_dict()."""
    src = nn.Sequential(WithExtraState(3.0), nn.ReLU())
    path = sp.Checkpoint(model=src).save(str(tmp_path / "c"))
    keys = {k for k, _ in sp.list_variables(path)}
    assert "model/0/_extra_state/.ATTRIBUTES/scale" in keys
    dst = nn.Sequential(WithExtraState(0.0), nn.ReLU())
    sp.Checkpoint(model=dst).restore(path).assert_consumed()
    assert torch.equal(dst[0].calibration["scale"], torch.tensor([3.0]))
    assert dst[0].calibration["steps"] == 3 and dst[0].calibration["mode"] == "amax"


def test_module_extra_state_that_cannot_be_stored_raises_naming_it(tmp_path):
    class Opaque(nn.Module):
        def get_extra_state(self):
            return object()

    ckpt = sp.Checkpoint(model=nn.Sequential(nn.Linear(2, 2), Opaque()))
    with pytest.raises(sp.UnsaveableObjectError, match=r"^\(root\)\.model\.1\._extra_state: "):
        ckpt.save(str(tmp_path / "c"))
    assert os.listdir(tmp_path) == []


def test_checkpoints_written_by_the_generic_adapter_stay_readable(tmp_path):
    """Before the fix a user's nn.Module subclass was saved through the generic state_dict()
    adapter (numpy leaves, no .TORCH_TENSORS). Restoring such a checkpoint into the module
    adapter says how to read it, and TorchStateDictTrackable reads it (tensor leaves back as
    tensors because they are tensors in the live state_dict())."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(3, 2)

    src = Net()
    path = sp.Checkpoint(model=sp.StateDictTrackable(src)).write(str(tmp_path / "old"))
    assert "model/.ATTRIBUTES/body..weight" in {k for k, _ in sp.list_variables(path)}
    status = sp.Checkpoint(model=Net()).read(path).expect_partial()
    with pytest.raises(sp.LoadStatusError, match="TorchStateDictTrackable"):
        status.assert_consumed()
    dst = Net()
    sp.Checkpoint(model=spt.TorchStateDictTrackable(dst)).read(path).assert_consumed()
    assert torch.equal(dst.body.weight, src.body.weight) and torch.equal(
        dst.body.bias, src.body.bias
    )
