"""Lightning through ShardpointCheckpointIO: exact resume (in a new process, against the
uninterrupted run and Lightning's own checkpointing), async paths, ModelCheckpoint rotation,
load_from_checkpoint, a save killed mid-way, damaged checkpoints. Real Lightning, CPU.
(test_lightning_dropin.py: every reading API with the one line alone, URLs, native files.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
from integration_helpers import lightning_run  # noqa: E402
from integration_helpers.common import (  # noqa: E402
    assert_same_tree,
    pickles_under,
    run_child,
    run_child_killed,
)
from shardpoint.integrations.lightning import (  # noqa: E402
    load_checkpoint,
    load_from_checkpoint,
)

EPOCH0 = "ckpts/epoch=0-step=4.ckpt"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two epochs with our plugin and with Lightning's own, in this process."""
    base = tmp_path_factory.mktemp("lightning")
    out: dict[str, Any] = {"base": base}
    for io in ("shardpoint", "native"):
        out[io] = lightning_run.train(io, str(base / io), epochs=2)
    return out


def test_resume_in_new_process_is_exact(runs: dict[str, Any]) -> None:
    ours, native = runs["shardpoint"], runs["native"]
    # our plugin does not change training, and both runs took 8 steps
    assert ours["losses"] == native["losses"] and ours["digest"] == native["digest"]
    assert ours["global_step"] == 8
    base = runs["base"]
    resumed, native_resumed = run_child(
        "lightning_run",
        "shardpoint",
        str(base / "shardpoint"),
        "2",
        str(base / "shardpoint" / EPOCH0),
        ";",
        "native",
        str(base / "native"),
        "2",
        str(base / "native" / EPOCH0),
    )
    assert resumed["losses"] == ours["losses"][4:] == native_resumed["losses"]
    assert resumed["digest"] == ours["digest"] == native_resumed["digest"]
    assert resumed["global_step"] == 8
    assert pickles_under(base / "shardpoint") == []


def test_checkpoint_holds_what_lightning_saves(runs: dict[str, Any]) -> None:
    base = runs["base"]
    ours = load_checkpoint(base / "shardpoint" / EPOCH0)
    native = torch.load(base / "native" / EPOCH0, weights_only=False)
    assert_same_tree(ours, native, roots=(str(base / "shardpoint"), str(base / "native")))
    assert {
        "state_dict",
        "optimizer_states",
        "lr_schedulers",
        "loops",
        "callbacks",
        "hyper_parameters",
        "epoch",
        "global_step",
    } <= set(ours)
    # one file at the path Lightning chose: a single-file shardpoint checkpoint
    assert (base / "shardpoint" / EPOCH0).is_file()
    assert sp.open(str(base / "shardpoint" / EPOCH0)).metadata == {
        "shardpoint.integration": "lightning"
    }


def test_load_from_checkpoint(runs: dict[str, Any]) -> None:
    path = runs["base"] / "shardpoint" / EPOCH0
    native = torch.load(runs["base"] / "native" / EPOCH0, weights_only=False)
    net_cls = lightning_run.Net  # type: ignore[attr-defined]
    model = net_cls.load_from_checkpoint(path)  # the mixin: our file
    assert_same_tree(dict(model.state_dict()), dict(native["state_dict"]))
    assert model.hparams.hidden == 16
    wider = load_from_checkpoint(net_cls, path, strict=False, lr=0.5)  # kwargs override
    assert wider.hparams.lr == 0.5
    # the mixin still reads Lightning's own files
    again = net_cls.load_from_checkpoint(runs["base"] / "native" / EPOCH0)
    assert_same_tree(dict(again.state_dict()), dict(native["state_dict"]))


@pytest.mark.parametrize("io", ["shardpoint-async", "lightning-async"])
def test_async_saves_are_exact(io: str, runs: dict[str, Any], tmp_path: Path) -> None:
    got = lightning_run.train(io, str(tmp_path), epochs=2)
    assert got["losses"] == runs["shardpoint"]["losses"]
    assert_same_tree(
        load_checkpoint(tmp_path / EPOCH0),
        load_checkpoint(runs["base"] / "shardpoint" / EPOCH0),
        roots=(str(tmp_path), str(runs["base"] / "shardpoint")),
    )
    assert load_checkpoint(tmp_path / "ckpts/last.ckpt")["global_step"] == 8
    assert pickles_under(tmp_path) == []


def test_save_top_k_rotation_deletes_through_the_plugin(tmp_path: Path) -> None:
    lightning_run.train("shardpoint", str(tmp_path), epochs=3, save_top_k=1)
    names = sorted(os.listdir(tmp_path / "ckpts"))
    assert len(names) == 2 and "last.ckpt" in names, names
    for name in names:  # what is left are committed checkpoints (files), nothing else
        assert (tmp_path / "ckpts" / name).is_file()
        assert sp.exists(str(tmp_path / "ckpts" / name))


def test_killed_save_leaves_last_resumable(runs: dict[str, Any], tmp_path: Path) -> None:
    # saves: epoch 0 (1), last (2), epoch 1 (3), last (4, killed while writing its data)
    proc = run_child_killed("lightning_run", "shardpoint", str(tmp_path), "2", kill_at_save=4)
    assert proc.returncode == -9 and "SELFKILL mid-save" in proc.stdout, proc.stderr[-2000:]
    last = tmp_path / "ckpts" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 4  # the previous commit, intact
    assert len(list(last.parent.glob("last.ckpt.tmp-*"))) == 1  # the killed save's temp file
    # resumed in this process (a new process resumes in test_resume_in_new_process_is_exact;
    # one child fewer keeps this file's wall time down)
    resumed = lightning_run.train("shardpoint", str(tmp_path), 2, resume="last")
    assert resumed["losses"] == runs["shardpoint"]["losses"][4:]
    assert resumed["digest"] == runs["shardpoint"]["digest"]
    assert list(last.parent.glob("last.ckpt.tmp-*")) == []  # removed by the next save


def test_damaged_checkpoint_fails_clearly_through_fit(runs: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad.ckpt"
    shutil.copy(runs["base"] / "shardpoint" / EPOCH0, bad)
    with sp.open(str(bad)) as r:
        info = r.info("state_dict/net.0.weight")
    raw = bytearray(bad.read_bytes())
    raw[4096 + info.offset + info.stored_bytes // 2] ^= 0xFF  # its shard starts at 4096 (§10)
    bad.write_bytes(bytes(raw))
    with pytest.raises(sp.CorruptCheckpointError, match="net.0.weight"):
        lightning_run.train("shardpoint", str(tmp_path / "run"), epochs=2, resume=str(bad))
    bad.write_bytes(bytes(raw[: len(raw) // 2]))  # a torn copy
    with pytest.raises(sp.CorruptCheckpointError, match="bad.ckpt"):
        lightning_run.train("shardpoint", str(tmp_path / "run"), epochs=2, resume=str(bad))
