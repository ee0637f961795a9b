"""``sp.CheckpointManager(..., local_directory=...)``: DESIGN.md §4's tier arguments build a
``TieredCheckpointManager``; without them ``CheckpointManager`` is what it always was."""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.objgraph import manager_tiers


def _ckpt():
    w = sp.Variable(np.zeros(1000, dtype=np.float32))
    return sp.Checkpoint(w=w), w


def test_tier_arguments_build_a_tiered_manager_that_saves_and_restores(tmp_path):
    ckpt, w = _ckpt()
    called = []
    m = sp.CheckpointManager(
        ckpt,
        tmp_path / "bucket",
        2,  # max_to_keep, positionally as CheckpointManager takes it
        init_fn=lambda: called.append(1),
        local_directory=tmp_path / "nvme",
        local_every=2,
        persistent_every=4,
    )
    assert type(m) is sp.TieredCheckpointManager
    assert not isinstance(m, sp.CheckpointManager)
    assert m.directory == str(tmp_path / "bucket")
    assert m.restore_or_initialize() is None and called == [1]
    for step in range(1, 13):
        w.assign(np.full(1000, step, dtype=np.float32))
        m.save(step)
    m.close()
    # persistent tier: steps 4, 8, 12 saved, max_to_keep=2 of them kept
    assert sorted(p.name for p in (tmp_path / "bucket").iterdir()) == ["ckpt-12", "ckpt-8"]

    ckpt2, w2 = _ckpt()
    m2 = sp.CheckpointManager(ckpt2, str(tmp_path / "bucket"), local_directory=tmp_path / "nvme")
    assert m2.restore_or_initialize() == 12
    assert np.array_equal(w2.numpy(), np.full(1000, 12, dtype=np.float32))
    m2.close()


def test_arguments_the_tiers_do_not_take_are_refused_by_name(tmp_path):
    ckpt, _ = _ckpt()
    local = tmp_path / "nvme"
    for kwargs, name in (
        ({"keep_checkpoint_every_n_hours": 1.0}, "keep_checkpoint_every_n_hours"),
        ({"checkpoint_name": "model"}, "checkpoint_name"),
        ({"step_counter": sp.Variable(np.int64(0)), "checkpoint_interval": 5}, "step_counter"),
        ({"delta": True}, "delta"),
        ({"digest": "sha256"}, "digest"),
    ):
        with pytest.raises(sp.InvalidArgumentError, match=name):
            sp.CheckpointManager(ckpt, tmp_path / "p", local_directory=local, **kwargs)
    with pytest.raises(sp.InvalidArgumentError, match="local_directory"):
        sp.CheckpointManager(ckpt, tmp_path / "p", local_every=10, persistent_every=100)
    with pytest.raises(sp.InvalidArgumentError, match="unexpected keyword"):
        sp.CheckpointManager(ckpt, tmp_path / "p", local_directory=local, bogus=1)
    # defaults passed explicitly are not a conflict
    m = sp.CheckpointManager(
        ckpt, tmp_path / "p", checkpoint_name="ckpt", delta=False, local_directory=local
    )
    assert isinstance(m, sp.TieredCheckpointManager)
    m.close()


def test_without_tier_arguments_checkpoint_manager_is_unchanged(tmp_path):
    ckpt, w = _ckpt()
    m = sp.CheckpointManager(ckpt, tmp_path / "plain", max_to_keep=1)
    assert type(m) is sp.CheckpointManager
    w.assign(np.ones(1000, dtype=np.float32))
    path = m.save()
    assert path == str(tmp_path / "plain" / "ckpt-1") and m.latest_checkpoint == path
    m.close()

    class Mine(sp.CheckpointManager):
        # a subclass that happens to name an argument like a tier argument keeps it
        def __init__(self, checkpoint, directory, *, local_directory=None):
            super().__init__(checkpoint, directory)
            self.extra = local_directory

    mine = Mine(ckpt, tmp_path / "sub", local_directory="x")
    assert type(mine) is Mine and mine.extra == "x"
    mine.close()


def test_without_the_tiers_registered_the_error_says_what_to_import(tmp_path, monkeypatch):
    monkeypatch.setattr(manager_tiers, "_factory", None)
    ckpt, _ = _ckpt()
    with pytest.raises(sp.InvalidArgumentError, match="import shardpoint.tiers"):
        sp.CheckpointManager(ckpt, tmp_path / "p", local_directory=tmp_path / "l")
