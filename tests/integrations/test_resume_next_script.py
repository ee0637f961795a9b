"""A plain trainer resuming from what shardpoint's integration wrote, in a fresh process whose
script never names shardpoint (the user's next script, or a colleague's):

- transformers' ``Trainer(...).train(resume_from_checkpoint="checkpoint-3")`` and ``=True`` on a
  ``ShardpointTrainer`` checkpoint. Its ``optimizer.pt``, ``scheduler.pt`` and ``rng_state.pth``
  are shardpoint single files, which the Trainer's own ``torch.load`` reads (the front); its
  compressed weights, and the states of an earlier version's checkpoint (in
  ``shardpoint.index``), reach it through ``_shardpoint_loaders/trainer_resume.py``. Before
  that front the Trainer found no ``optimizer.pt`` and went on *silently* with a fresh
  optimizer, a restarted schedule and other random draws.
- accelerate's ``Accelerator.load_state(dir)`` and, with automatic naming, ``load_state()`` on a
  ``ShardpointAccelerator`` directory. Before the front (``accelerator_state.py``) it stopped
  at "No such file or directory: '.../optimizer.bin'".

Each resumed run matches the uninterrupted one exactly (losses as hex floats, a digest of the
final weights), with the weights as safetensors and compressed in the part; the framework's own
checkpoints stay its own; with the reading turned off the error names shardpoint. Real
transformers and accelerate, tiny models, CPU."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("torch")

from integration_helpers import accel_run, hf_run  # noqa: E402
from integration_helpers.common import run_child  # noqa: E402


@dataclass(frozen=True)
class Flow:
    """One framework's run: its helper, length, the checkpoint resumed, the steps before it,
    how "the newest" is asked for, and the refusal's words."""

    helper: Any
    length: str
    checkpoint: str
    done: int
    newest: str
    refusal: tuple[str, str]


FLOWS = {
    "trainer": Flow(
        hf_run, "6", "checkpoint-3", 3, "true",
        # Trainer's own torch.load of optimizer.pt, a shardpoint file
        ("_pickle.UnpicklingError", "optimizer.pt' is a shardpoint"),
    ),
    "accelerate": Flow(
        accel_run, "2", "checkpoints/checkpoint_0", 4, "latest",
        ("ValueError", "ShardpointAccelerator: its states are in shardpoint.index"),
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(FLOWS))
def uninterrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    flow = FLOWS[request.param]
    base = tmp_path_factory.mktemp(request.param)
    runs = {
        kind: flow.helper.train(kind, str(base / kind), int(flow.length))
        for kind in ("shardpoint", "shardpoint-compressed", "native")
    }
    assert runs["shardpoint"]["losses"] == runs["native"]["losses"]
    return request.param, flow, base, runs


def _module(flow: Flow) -> str:
    return flow.helper.__name__.rpartition(".")[2]


KINDS = ("shardpoint", "shardpoint-compressed")


@pytest.fixture(scope="module")
def resumed(uninterrupted: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One plain script (a fresh process, the framework's own run) resuming, in order: the
    framework's own checkpoint, then each kind of ours by path and as the newest checkpoint of
    its output directory. The tests below check one resume each."""
    name, flow, base, _ = uninterrupted
    tmp = tmp_path_factory.mktemp(f"resumed-{name}")
    args = ["native", str(tmp / "native-r"), flow.length, str(base / "native" / flow.checkpoint)]
    for kind in KINDS:
        # the newest checkpoint of the output directory, as the framework finds it
        latest = tmp / kind / "latest"
        shutil.copytree(base / kind / flow.checkpoint, latest / flow.checkpoint)
        args += [";", "native", str(tmp / kind / "r"), flow.length]
        args += [str(base / kind / flow.checkpoint), ";", "native", str(latest), flow.length]
        args += [flow.newest]
    native, *ours = run_child(_module(flow), *args)
    return {"native": native, **{k: ours[2 * i : 2 * i + 2] for i, k in enumerate(KINDS)}}


@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_trainer_resumes_a_shardpoint_checkpoint_exactly(
    uninterrupted: Any, resumed: dict[str, Any], kind: str
) -> None:
    name, flow, base, runs = uninterrupted
    ck = base / kind / flow.checkpoint
    if name == "trainer":  # under Trainer's name, in our format: no pickle
        assert (ck / "optimizer.pt").read_bytes()[:8] == b"SPSINGLE"
    else:
        assert not (ck / "optimizer.bin").exists()
    by_path, by_latest = resumed[kind]
    want = runs[kind]
    for got in (by_path, by_latest):
        assert got["losses"] == want["losses"][flow.done :]
        assert got["digest"] == want["digest"] == runs["native"]["digest"]
        # accelerate's registered object (the trainer's run has none)
        assert got.get("progress") == want.get("progress")


def test_native_checkpoints_stay_the_frameworks_own(
    uninterrupted: Any, resumed: dict[str, Any]
) -> None:
    _, flow, _, runs = uninterrupted
    got = resumed["native"]  # the script's first resume: nothing of ours read before it
    assert got["losses"] == runs["native"]["losses"][flow.done :]
    assert got["digest"] == runs["native"]["digest"]


def test_reading_turned_off_fails_instead_of_resuming_silently_wrong(
    uninterrupted: Any, tmp_path: Path
) -> None:
    _, flow, base, _ = uninterrupted
    with pytest.raises(AssertionError) as err:
        run_child(
            _module(flow), "native", str(tmp_path / "r"), flow.length,
            str(base / "shardpoint" / flow.checkpoint), env={"SHARDPOINT_TORCH_LOAD": "0"},
        )  # fmt: skip
    last = str(err.value).strip().splitlines()[-1]
    assert last.startswith(flow.refusal[0]) and flow.refusal[1] in last, last
    assert "SHARDPOINT_TORCH_LOAD" in last


@pytest.mark.parametrize("uninterrupted", ["trainer"], indirect=True)
def test_a_plain_trainer_resumes_an_earlier_versions_checkpoint(
    uninterrupted: Any, tmp_path: Path
) -> None:
    """Before this round ``ShardpointTrainer`` kept the optimizer, scheduler and RNG states in
    ``shardpoint.index`` (no ``optimizer.pt``): the front reads them from there."""
    _, flow, base, runs = uninterrupted
    from shardpoint.integrations import hf_trainer
    from shardpoint.integrations._state import part_prefix, save_tree

    ck = tmp_path / flow.checkpoint
    shutil.copytree(base / "shardpoint-compressed" / flow.checkpoint, ck)
    tree = hf_trainer.load_checkpoint(ck)
    for f in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (ck / f).unlink()
    for f in ck.glob("shardpoint.*"):
        f.unlink()
    save_tree(tree, part_prefix(ck, "shardpoint"), integration="hf_trainer")
    (got,) = run_child(_module(flow), "native", str(tmp_path / "r"), flow.length, str(ck))
    assert got["losses"] == runs["shardpoint-compressed"]["losses"][flow.done :]
    assert got["digest"] == runs["native"]["digest"]


@pytest.mark.parametrize("uninterrupted", ["trainer"], indirect=True)
def test_an_earlier_versions_checkpoint_that_lost_its_index_is_refused(
    uninterrupted: Any, tmp_path: Path
) -> None:
    """The same earlier-version checkpoint (weights whole in ``model.safetensors``, the
    optimizer, scheduler and RNG states only in ``shardpoint.index``) whose index was then
    lost: the weights load, Trainer finds no ``optimizer.pt`` and went on silently with a fresh
    optimizer. The resume now stops at the optimizer step with the lost-index error."""
    _, flow, base, _ = uninterrupted
    from shardpoint.integrations import hf_trainer
    from shardpoint.integrations._state import part_prefix, save_tree

    ck = tmp_path / flow.checkpoint
    shutil.copytree(base / "shardpoint" / flow.checkpoint, ck)
    tree = hf_trainer.load_checkpoint(ck)
    for f in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (ck / f).unlink()
    for f in ck.glob("shardpoint.*"):
        f.unlink()
    save_tree(tree, part_prefix(ck, "shardpoint"), integration="hf_trainer")
    assert (ck / "model.safetensors").exists()
    (ck / "shardpoint.index").unlink()
    with pytest.raises(AssertionError) as err:
        run_child(_module(flow), "native", str(tmp_path / "r"), flow.length, str(ck))
    last = str(err.value).strip().splitlines()[-1]
    assert last.startswith("shardpoint.errors.CorruptCheckpointError"), last
    assert "Trainer resume (optimizer and scheduler states)" in last
    assert f"{str(ck / 'shardpoint.index')!r} is missing" in last, last
