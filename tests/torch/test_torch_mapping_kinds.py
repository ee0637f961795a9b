"""The kind of each mapping comes back (storage/mapping_kinds.py): a ``state_dict()``'s
``OrderedDict`` with its ``_metadata`` (module versions), ``Counter``, ``defaultdict``.

Before, every mapping came back a plain ``dict``. A module that migrates older checkpoints by
its version (torch's idiom: ``if version is None or version < 2``, as BatchNorm does) then
"migrated" a current one: ``load_from_checkpoint`` in the next script gave silently wrong
weights, with and without Lightning's plugin. Read here in fresh processes that never import
shardpoint (``torch.load``'s front), as the user's next script does."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import shardpoint.torch as spt  # noqa: E402
from shardpoint.storage.mapping_kinds import rebuild_mapping  # noqa: E402
from shardpoint.torch.distributed import _merge_structures  # noqa: E402

#: a module whose format changed in version 2 (it stored ``log(scale)`` before)
VERSIONED = """
import torch


class Scale(torch.nn.Module):
    _version = 2

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((2,), 3.0))

    def _load_from_state_dict(self, sd, prefix, local_metadata, *args):
        if local_metadata.get("version") is None or local_metadata["version"] < 2:
            sd[prefix + "scale"] = sd[prefix + "scale"].exp()  # an old checkpoint: migrate
        super()._load_from_state_dict(sd, prefix, local_metadata, *args)
"""

READ = """
import json, sys, torch
import versioned

state = torch.load(sys.argv[1], map_location="cpu")
m = torch.nn.Sequential(versioned.Scale(), torch.nn.BatchNorm1d(2))
m.load_state_dict(state["model"])
print(json.dumps({
    "kinds": [type(state[k]).__name__ for k in ("model", "counter", "dd", "od", "plain")],
    "metadata": {k: dict(v) for k, v in state["model"]._metadata.items()},
    "scale": m[0].scale.tolist(),
    "milestones": sorted(state["sched"]["milestones"].elements()),
    "factory": state["dd"].default_factory.__name__,
    "od": list(state["od"]),
}))
"""


def _child(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_mapping_kinds_come_back_in_the_next_script(tmp_path: Path) -> None:
    (tmp_path / "versioned.py").write_text(VERSIONED)
    sys.path.insert(0, str(tmp_path))
    try:
        import versioned  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    model = torch.nn.Sequential(versioned.Scale(), torch.nn.BatchNorm1d(2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 4, 4])
    state = {
        "model": model.state_dict(),
        "sched": sched.state_dict(),
        "counter": collections.Counter("abca"),
        "dd": collections.defaultdict(list, {"k": [1]}),
        "od": collections.OrderedDict([("b", 1), ("a", 2)]),
        "plain": {"x": 1},
    }
    path = tmp_path / "state.ckpt"
    spt.save(state, path, single_file=True)
    proc = _child(READ, tmp_path, str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["kinds"] == ["OrderedDict", "Counter", "defaultdict", "OrderedDict", "dict"]
    assert out["metadata"] == {"": {"version": 1}, "0": {"version": 2}, "1": {"version": 2}}
    assert out["scale"] == [3.0, 3.0]  # not exp(3): the current version was not migrated
    assert out["milestones"] == [2, 4, 4]
    assert out["factory"] == "list" and out["od"] == ["b", "a"]
    # in this process too, through shardpoint's own load
    mine = spt.load(path)
    assert mine["model"]._metadata == state["model"]._metadata
    assert mine["sched"]["milestones"] == sched.state_dict()["milestones"]


LIGHTNING_TRAIN = """
import sys, torch, lightning as L
import versioned
from shardpoint.integrations.lightning import ShardpointCheckpointIO


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.s = versioned.Scale()

    def training_step(self, batch, i):
        return self.s.scale.sum() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


if __name__ == "__main__":
    t = L.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                  plugins=[ShardpointCheckpointIO()], accelerator="cpu")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 1)), 1)
    t.fit(M(), data)
    t.save_checkpoint(sys.argv[1])
"""


def test_load_from_checkpoint_keeps_module_versions(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    (tmp_path / "versioned.py").write_text(VERSIONED)
    (tmp_path / "train.py").write_text(LIGHTNING_TRAIN)
    path = tmp_path / "m.ckpt"
    proc = _child(
        "import runpy, sys; sys.argv = ['train.py', sys.argv[1]]; "
        "runpy.run_path('train.py', run_name='__main__')",
        tmp_path,
        str(path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert path.read_bytes()[:8] == b"SPSINGLE"
    read = "import sys, train; m = train.M.load_from_checkpoint(sys.argv[1]); print(m.s.scale.tolist())"
    proc = _child(read, tmp_path, str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[3.0, 3.0]"


def test_hostile_or_unknown_kinds_are_plain_dicts() -> None:
    items = {"a": 1}
    for node in (
        {"c": "builtins.eval"}, {"c": "defaultdict", "f": "os.system"},
        {"c": "Counter", "x": 1},
        {"c": "OrderedDict", "m": ["not", "a", "mapping"]}, {"c": 7},
    ):  # fmt: skip
        got = rebuild_mapping({"d": [], **node}, dict(items))
        assert got == items
    assert type(rebuild_mapping({"c": "Counter"}, {"a": "x"})) is dict  # counts only
    od = rebuild_mapping({"c": "OrderedDict", "m": ["x"]}, dict(items))
    assert type(od) is collections.OrderedDict and not hasattr(od, "_metadata")
    assert type(rebuild_mapping({"c": "defaultdict", "f": "os.system"}, {})) is dict


def test_ranks_merged_structures_keep_the_kind() -> None:
    a = {"d": [["x", "s", {"v": "x"}]], "c": "OrderedDict", "m": {"": {"version": 1}}}
    b = {"d": [["y", "s", {"v": "y"}]], "c": "OrderedDict", "m": {"": {"version": 1}}}
    merged = _merge_structures([{"d": [["sd", "s", a]]}, {"d": [["sd", "s", b]]}])
    ((name, _, node),) = merged["d"]
    assert name == "sd" and node["c"] == "OrderedDict" and node["m"] == {"": {"version": 1}}
    assert [k for k, _, _ in node["d"]] == ["x", "y"]
