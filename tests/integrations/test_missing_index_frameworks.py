"""The next script on a damaged checkpoint of DeepSpeed, ``torch.distributed.checkpoint``
(DCP), orbax and the serving readers' ``weights_iterator``, in fresh processes: the three
ways real life damages one — its ``.index`` files gone while the data shards remain (a save
killed before its commit, a copy that left them out), a data shard cut to half its length (a
full disk, a copy that stopped), a data shard gone.

Each call must raise shardpoint's error, of the builtin class the framework's callers catch,
naming the damaged file: ``NotFoundError`` (a ``FileNotFoundError``) naming the lost index
and saying that the data shards are there; ``CorruptCheckpointError`` (a ``ValueError``)
naming the cut shard; ``NotFoundError`` naming the shard that is gone. Through DCP the error
is DCP's ``CheckpointException`` as well (``shardpoint.torch.dcp_errors``), as DCP's own load
errors are, so code written against either catches it. Before this round DCP
answered a lost index with "No such file or directory: 'P/.metadata'" and every damage with
its ``CheckpointException`` (a ``BaseException`` whose message is a traceback); orbax's
restore and ``weights_iterator`` with "no checkpoint at P ... neither exists"; DeepSpeed's own
resume through ``use_shardpoint`` with words of its own. The same checkpoints undamaged load
in the same process (the fronts that refuse damage read them). Real DeepSpeed (ZeRO-2, gloo,
one rank), torch DCP, orbax and jax, tiny models, CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("torch")

from integration_helpers.common import TESTS  # noqa: E402

#: both scripts' start: one rank without a launcher, and the tiny ZeRO-2 engine DeepSpeed
#: saves and loads (``ours``: through ``use_shardpoint``)
COMMON = r"""
import json, logging, os, sys, warnings
warnings.simplefilter("ignore")
for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "0"), ("RANK", "0"),
             ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(k, v)
import torch


def engine(ours):
    import deepspeed
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    cfg = {"train_batch_size": 4, "zero_optimization": {"stage": 2},
           "zero_allow_untested_optimizer": True, "steps_per_print": 10_000}
    eng, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.02), config=cfg)
    if ours:
        from shardpoint.integrations.deepspeed import use_shardpoint
        use_shardpoint(eng)
    return eng
"""

#: the user's training script (after COMMON): one checkpoint per framework, through our
#: integration
MAKE = r"""
base = sys.argv[1]
import shardpoint.torch as sptorch

torch.manual_seed(0)
sd = {"a.weight": torch.randn(3, 4), "a.bias": torch.ones(3), "b.weight": torch.randn(64, 64)}
sptorch.save(sd, os.path.join(base, "weights", "ck"), shards=2)

import torch.distributed.checkpoint as dcp
lin = torch.nn.Linear(4, 3)
dcp.save({"model": lin.state_dict()}, storage_writer=sptorch.StorageWriter(
    os.path.join(base, "dcp", "ck")))
os.makedirs(os.path.join(base, "dcpdir"))  # a directory, as DCP's own writer is given
dcp.save({"model": lin.state_dict()}, storage_writer=sptorch.StorageWriter(
    os.path.join(base, "dcpdir")))

import jax.numpy as jnp
import orbax.checkpoint as ocp
from shardpoint.jax import ShardpointSave
with ocp.CheckpointManager(os.path.join(base, "orbax")) as mngr:
    mngr.save(5, args=ShardpointSave({"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(3)}))
    mngr.wait_until_finished()

eng = engine(True)
eng.backward(eng(torch.randn(4, 8)).pow(2).mean())
eng.step()
eng.save_checkpoint(os.path.join(base, "ds"))
print("saved")
"""

#: the next script (after COMMON): each call, its outcome as the MRO's class names, the
#: class's module and the message
PROBE = r"""
logging.disable(logging.CRITICAL)  # orbax logs the step it could not read


def dcp_target():
    return {"model": torch.nn.Linear(4, 3).state_dict()}


def call(kind, path):
    import torch.distributed.checkpoint as dcp
    if kind == "ds.load_checkpoint":  # a plain engine: DeepSpeed's torch.load, fronted
        return str(engine(False).load_checkpoint(path)[0])
    if kind == "ds.use_shardpoint":  # the engine's own resume through shardpoint's engine
        return str(engine(True).load_checkpoint(path)[0])
    if kind == "zero_to_fp32":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        return sorted(get_fp32_state_dict_from_zero_checkpoint(path))
    if kind == "sp.zero_to_fp32":
        from shardpoint.integrations.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        return sorted(get_fp32_state_dict_from_zero_checkpoint(path))
    if kind == "dcp.load":
        sd = dcp_target()
        dcp.load(sd, checkpoint_id=path)
        return sorted(sd["model"])
    if kind == "dcp.load(StorageReader)":
        import shardpoint.torch as sptorch
        sd = dcp_target()
        dcp.load(sd, storage_reader=sptorch.StorageReader(path))
        return sorted(sd["model"])
    if kind == "FileSystemReader":
        sd = dcp_target()
        dcp.load(sd, storage_reader=dcp.FileSystemReader(path))
        return sorted(sd["model"])
    if kind == "dcp_to_torch_save":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save(path, path.rstrip("/") + ".pt")
        return sorted(torch.load(path.rstrip("/") + ".pt", weights_only=False))
    if kind.startswith("orbax"):
        import orbax.checkpoint as ocp
        with ocp.CheckpointManager(path) as mngr:
            if kind == "orbax.restore":  # without args: the handler found by its type string
                return sorted(mngr.restore(5))
            from shardpoint.jax import ShardpointRestore
            return sorted(mngr.restore(5, args=ShardpointRestore()))
    if kind == "weights_iterator":
        import shardpoint.torch as sptorch
        return sorted(name for name, _ in sptorch.weights_iterator(path))
    raise ValueError(kind)


out = {}
for label, kind, path in json.loads(sys.argv[1]):
    try:
        out[label] = {"ok": call(kind, path)}
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        out[label] = {"mro": [c.__name__ for c in type(e).__mro__],
                      "module": type(e).__module__, "msg": str(e)}
print(json.dumps(out))
"""

#: flow -> (the checkpoint it reads, relative to the base; the calls reading it)
FLOWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ds": (
        "ds",
        ("ds.load_checkpoint", "ds.use_shardpoint", "zero_to_fp32", "sp.zero_to_fp32"),
    ),
    "dcp": (
        "dcp/ck",
        ("dcp.load", "dcp.load(StorageReader)", "FileSystemReader", "dcp_to_torch_save"),
    ),
    "dcpdir": ("dcpdir", ("dcp.load", "FileSystemReader")),
    "orbax": ("orbax", ("orbax.restore", "orbax.restore(args)")),
    "weights": ("weights/ck", ("weights_iterator",)),
}
#: flow -> the data shard damaged (cut or deleted): one the read opens
SHARD = {
    "ds": "global_step1/mp_rank_00_model_states.pt/state.data-00000-of-00001",
    "dcp": "ck.data-00001-of-00004",
    "dcpdir": "checkpoint.data-00001-of-00004",
    "orbax": "5/default/checkpoint.data-00000-of-00001",
    "weights": "ck.data-00001-of-00002",
}
#: flow -> the index the lost-index error names (the first one the read looks for)
INDEX = {
    "ds": "global_step1/mp_rank_00_model_states.pt/state.index",
    "dcp": "ck.index",
    "dcpdir": "checkpoint.index",
    "orbax": "5/default/checkpoint.index",
    "weights": "ck.index",
}
HOWS = ("intact", "noindex", "trunc", "del")
#: DeepSpeed JIT-builds its CPU communication op with ninja from the venv
ENV = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}


def _run(script: str, *args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    env.update(ENV)
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def _damage(flow_dir: Path, flow: str, how: str) -> None:
    """Damage the copy ``flow_dir`` of a checkpoint as ``how`` says."""
    if how == "noindex":
        gone = list(flow_dir.rglob("*.index"))
        assert gone, flow_dir
        for f in gone:
            f.unlink()
    elif how in ("trunc", "del"):
        shard = flow_dir / SHARD[flow]
        assert shard.is_file(), shard
        if how == "trunc":
            os.truncate(shard, shard.stat().st_size // 2)
        else:
            shard.unlink()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Every call of :data:`FLOWS` on every damage of :data:`HOWS`, in one fresh process."""
    made = tmp_path_factory.mktemp("made")
    assert _run(COMMON + MAKE, str(made)) == "saved"
    base = tmp_path_factory.mktemp("damaged")
    calls = []
    for flow, (where, kinds) in FLOWS.items():
        for how in HOWS:
            root = base / how / flow
            shutil.copytree(made / where.split("/")[0], root)
            _damage(root, flow, how)
            path = root / where.partition("/")[2] if "/" in where else root
            calls += [[f"{kind} {flow} {how}", kind, str(path)] for kind in kinds]
    return base, json.loads(_run(COMMON + PROBE, json.dumps(calls)))


#: (flow, call) of every call
CASES = [(flow, kind) for flow, (_, kinds) in FLOWS.items() for kind in kinds]


def _failure(got: dict[str, Any], cls: str, builtin: str, flow: str) -> str:
    assert "mro" in got, got  # it loaded: wrong, the checkpoint is damaged
    if flow.startswith("dcp"):
        # DCP's fronts raise our class and DCP's CheckpointException at once: callers written
        # against either catch it (shardpoint.torch.dcp_errors)
        assert got["mro"][0] == "DCP" + cls, got
        assert got["module"] == "shardpoint.torch.dcp_errors", got
        assert cls in got["mro"] and "CheckpointException" in got["mro"], got
    else:
        assert got["mro"][0] == cls and got["module"] == "shardpoint.errors", got
    # an Exception too: DCP's own CheckpointException is not one (``except Exception`` missed it)
    assert builtin in got["mro"] and "Exception" in got["mro"], got
    return str(got["msg"])


@pytest.mark.parametrize(("flow", "kind"), CASES)
def test_an_intact_checkpoint_loads(
    outcomes: tuple[Path, dict[str, Any]], flow: str, kind: str
) -> None:
    got = outcomes[1][f"{kind} {flow} intact"]
    assert "ok" in got and got["ok"], got


@pytest.mark.parametrize(("flow", "kind"), CASES)
def test_a_lost_index_is_named(outcomes: tuple[Path, dict[str, Any]], flow: str, kind: str) -> None:
    base, got = outcomes
    msg = _failure(got[f"{kind} {flow} noindex"], "NotFoundError", "FileNotFoundError", flow)
    assert f"{str(base / 'noindex' / flow / INDEX[flow])!r} is missing" in msg, msg
    assert "is a shardpoint checkpoint" in msg and "data shards" in msg, msg


@pytest.mark.parametrize(("flow", "kind"), CASES)
def test_a_cut_shard_is_named(outcomes: tuple[Path, dict[str, Any]], flow: str, kind: str) -> None:
    base, got = outcomes
    msg = _failure(got[f"{kind} {flow} trunc"], "CorruptCheckpointError", "ValueError", flow)
    assert msg.startswith(f"{base / 'trunc' / flow / SHARD[flow]}: corrupt checkpoint"), msg
    assert "truncated or replaced" in msg, msg


@pytest.mark.parametrize(("flow", "kind"), CASES)
def test_a_lost_shard_is_named(outcomes: tuple[Path, dict[str, Any]], flow: str, kind: str) -> None:
    base, got = outcomes
    msg = _failure(got[f"{kind} {flow} del"], "NotFoundError", "FileNotFoundError", flow)
    assert msg.startswith(f"{base / 'del' / flow / SHARD[flow]}: not found"), msg


def test_two_ranks_refuse_a_damaged_dcp_checkpoint_together(tmp_path: Path) -> None:
    """Two gloo ranks ``dcp.load`` a checkpoint of ours with its index lost, a shard cut, a
    shard gone: each rank raises the same error before DCP's collectives (none waits on the
    other: a hang would end in the timeout), of our class and DCP's, naming the file."""
    from rank_rendezvous import run_rank_modules

    outs = run_rank_modules("integration_helpers.dcp_damage_ranks", tmp_path, [], timeout=180)
    names = outs[0]
    expect = {"noindex": "DCPNotFoundError", "trunc": "DCPCorruptCheckpointError",
              "del": "DCPNotFoundError"}  # fmt: skip
    for how, cls in expect.items():
        damaged = str(tmp_path / how / names[how + "-file"])
        for rank, out in enumerate(outs):
            got = out[how]
            assert "mro" in got, (rank, how, got)  # it loaded a damaged checkpoint: wrong
            assert got["mro"][0] == cls and "CheckpointException" in got["mro"], (rank, got)
            assert damaged in got["msg"], (rank, how, got["msg"])
