"""State file, readers (STATE-01 … 07), CheckpointManager (MGR-01 … 11) and crash safety."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from shardpoint.errors import MissingKeyError
from shardpoint.objgraph import checkpoint_state, storage_io
from shardpoint.objgraph import manager as manager_mod
from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.checkpoint_reader import list_variables, load_checkpoint, load_variable
from shardpoint.objgraph.checkpoint_state import latest_checkpoint, read_checkpoint_state
from shardpoint.objgraph.errors import CheckpointStateError
from shardpoint.objgraph.manager import CheckpointManager
from shardpoint.objgraph.naming import OBJECT_GRAPH_KEY
from shardpoint.objgraph.state_dict_adapter import STRUCTURE_ATTRIBUTE
from shardpoint.objgraph.variables import Variable


def f32(x):
    return Variable(np.asarray(x, dtype=np.float32))


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock(1_000_000.0)
    monkeypatch.setattr(manager_mod, "_now", c)
    return c


def files_in(directory):
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


# --- STATE ----------------------------------------------------------------------------------


def test_state01_state_file_fields_relative_paths(tmp_path, clock):
    """STATE-01: model path, all paths oldest->newest, timestamps, last preserved."""
    mgr = CheckpointManager(Checkpoint(v=f32(1)), tmp_path, max_to_keep=2)
    for _ in range(3):
        clock.t += 10
        mgr.save()
    state = read_checkpoint_state(tmp_path)
    assert state.model_checkpoint_path == "ckpt-3"
    assert state.all_model_checkpoint_paths == ["ckpt-2", "ckpt-3"]
    assert state.all_model_checkpoint_timestamps == [1_000_020.0, 1_000_030.0]
    assert state.last_preserved_timestamp == 1_000_000.0
    text = (tmp_path / "checkpoint").read_text()
    assert text.startswith('model_checkpoint_path: "ckpt-3"\n')
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".checkpoint")]  # no temp left


def test_state02_latest_checkpoint_joins_dir(tmp_path, monkeypatch):
    """STATE-02: relative dir in -> relative out; absolute in -> absolute; nothing -> None."""
    monkeypatch.chdir(tmp_path)
    Checkpoint(v=f32(1)).save("./e/ckpt")
    assert latest_checkpoint("./e") == "./e/ckpt-1"
    assert latest_checkpoint(str(tmp_path / "e")) == str(tmp_path / "e" / "ckpt-1")
    assert latest_checkpoint(tmp_path / "missing") is None
    os.mkdir(tmp_path / "emptydir")
    assert latest_checkpoint(tmp_path / "emptydir") is None


def test_state03_index_gone_returns_none_and_logs(tmp_path, caplog):
    """STATE-03."""
    path = Checkpoint(v=f32(1)).save(tmp_path / "c")
    os.unlink(path + ".index")
    with caplog.at_level(logging.ERROR, logger="shardpoint"):
        assert latest_checkpoint(tmp_path) is None
    assert f"Couldn't match files for checkpoint {path}" in caplog.text


def test_state04_empty_and_unparsable_state_files(tmp_path, caplog):
    """STATE-04: empty -> ValueError; unparsable -> warning and None."""
    (tmp_path / "checkpoint").write_text("")
    with pytest.raises(CheckpointStateError, match="Invalid checkpoint state loaded from"):
        latest_checkpoint(tmp_path)
    with pytest.raises(ValueError):
        CheckpointManager(Checkpoint(), tmp_path)
    (tmp_path / "checkpoint").write_text("this is { not a state file\n")
    with caplog.at_level(logging.WARNING, logger="shardpoint"):
        assert latest_checkpoint(tmp_path) is None
    assert "ParseError" in caplog.text and "Checkpoint ignored" in caplog.text


def test_state05_load_checkpoint_dir_or_prefix(tmp_path):
    """STATE-05."""
    ckpt = Checkpoint(v=f32(2.5))
    ckpt.save(tmp_path / "c")
    second = ckpt.save(tmp_path / "c")
    with load_checkpoint(tmp_path) as reader:
        assert reader.prefix == second
        assert float(reader.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")) == 2.5
    with load_checkpoint(tmp_path / "c-1") as reader:
        assert reader.has_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
        assert int(reader.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE")) == 1
    os.mkdir(tmp_path / "none")
    with pytest.raises(ValueError, match="Couldn't find 'checkpoint' file or checkpoints"):
        load_checkpoint(tmp_path / "none")


class Cursor:
    """Data-iterator stand-in: its position is a state dict."""

    def __init__(self):
        self.position, self.epoch, self.buffer = 0, 0, np.arange(5, dtype=np.int64)

    def state_dict(self):
        return {"position": self.position, "epoch": self.epoch, "buffer": self.buffer}

    def load_state_dict(self, state):
        self.position, self.epoch = state["position"], state["epoch"]
        self.buffer = np.array(state["buffer"])


def test_state06_list_variables_and_maps(tmp_path):
    """STATE-06: sorted (key, shape) incl. the object graph; maps cover every key."""
    path = Checkpoint(v=f32([[1, 2, 3]]), it=Cursor()).write(tmp_path / "c")
    listing = list_variables(path)
    assert listing == sorted(listing)
    assert (OBJECT_GRAPH_KEY, []) in listing
    assert ("v/.ATTRIBUTES/VARIABLE_VALUE", [1, 3]) in listing
    assert ("it/.ATTRIBUTES/buffer", [5]) in listing
    with load_checkpoint(path) as reader:
        dtypes = reader.get_variable_to_dtype_map()
        shapes = reader.get_variable_to_shape_map()
    assert set(dtypes) == set(shapes) == {k for k, _ in listing}
    assert dtypes["v/.ATTRIBUTES/VARIABLE_VALUE"] == "float32"
    assert dtypes["it/.ATTRIBUTES/position"] == "int"
    assert dtypes[f"it/.ATTRIBUTES/{STRUCTURE_ATTRIBUTE.replace('.', '..')}"] == "json"


def test_state07_load_variable(tmp_path):
    """STATE-07: trailing ':0' stripped; missing key -> KeyError naming it."""
    path = Checkpoint(v=f32(4.0)).write(tmp_path / "c")
    assert float(load_variable(path, "v/.ATTRIBUTES/VARIABLE_VALUE:0")) == 4.0
    with pytest.raises(MissingKeyError, match="Key nope not found in checkpoint"):
        load_variable(path, "nope")
    with pytest.raises(KeyError):
        load_variable(path, "nope")


# --- MGR ------------------------------------------------------------------------------------


def test_mgr01_argument_validation(tmp_path):
    """MGR-01."""
    with pytest.raises(ValueError, match="positive integer or `None` for `max_to_keep`, got 0"):
        CheckpointManager(Checkpoint(), tmp_path, max_to_keep=0)
    with pytest.raises(ValueError, match="`step_counter` should be passed"):
        CheckpointManager(Checkpoint(), tmp_path, checkpoint_interval=2)


def test_mgr02_save_numbering_and_path(tmp_path, monkeypatch):
    """MGR-02: ./tf_ckpts/ckpt-1 style paths; counter incremented."""
    monkeypatch.chdir(tmp_path)
    ckpt = Checkpoint(v=f32(1))
    mgr = CheckpointManager(ckpt, "./runs", max_to_keep=3)
    assert mgr.save() == "./runs/ckpt-1" and int(ckpt.save_counter) == 1
    named = CheckpointManager(ckpt, "./runs", checkpoint_name="model")
    assert named.save() == "./runs/model-2"


def test_mgr03_custom_checkpoint_number(tmp_path):
    """MGR-03: number from an int or integer Variable; counter still incremented."""
    ckpt = Checkpoint(v=f32(1))
    mgr = CheckpointManager(ckpt, tmp_path, max_to_keep=5)
    assert mgr.save(checkpoint_number=100).endswith("ckpt-100")
    step = Variable(np.int64(7))
    assert mgr.save(checkpoint_number=step).endswith("ckpt-7")
    assert int(step) == 7 and int(ckpt.save_counter) == 2
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-100", "ckpt-7"]


def test_mgr04_overwrite_moves_to_end_and_sweep_deletes_files(tmp_path, clock):
    """MGR-04."""
    mgr = CheckpointManager(Checkpoint(v=f32(1)), tmp_path, max_to_keep=2)
    mgr.save(checkpoint_number=1)
    mgr.save(checkpoint_number=2)
    mgr.save(checkpoint_number=1)  # overwritten -> moved to the end
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-2", "ckpt-1"]
    mgr.save(checkpoint_number=3)
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-1", "ckpt-3"]
    assert not any(n.startswith("ckpt-2.") for n in os.listdir(tmp_path))


def test_mgr05_guide_two_runs_of_five(tmp_path, monkeypatch):
    """MGR-05: max_to_keep=3, two managers x 5 saves -> ckpt-8, 9, 10 left."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        ckpt = Checkpoint(step=Variable(np.int32(0)))
        mgr = CheckpointManager(ckpt, "./tf_ckpts", max_to_keep=3)
        ckpt.restore(mgr.latest_checkpoint)
        for _ in range(5):
            ckpt.step.assign_add(1)
            mgr.save()
    assert mgr.checkpoints == ["./tf_ckpts/ckpt-8", "./tf_ckpts/ckpt-9", "./tf_ckpts/ckpt-10"]
    names = files_in("tf_ckpts")
    assert names[0] == "checkpoint"
    assert {n.split(".")[0] for n in names[1:]} == {"ckpt-8", "ckpt-9", "ckpt-10"}


def test_mgr06_keep_all_then_trim_later(tmp_path):
    """MGR-06."""
    ckpt = Checkpoint(v=f32(1))
    keep_all = CheckpointManager(ckpt, tmp_path, max_to_keep=None, checkpoint_name="model")
    for _ in range(4):
        keep_all.save()
    assert len(keep_all.checkpoints) == 4
    trimmed = CheckpointManager(ckpt, tmp_path, max_to_keep=2, checkpoint_name="model")
    assert len(trimmed.checkpoints) == 4  # recovered list kept until the next save
    trimmed.save()
    assert [os.path.basename(p) for p in trimmed.checkpoints] == ["model-4", "model-5"]
    assert not (tmp_path / "model-1.index").exists()


def test_mgr07_adopts_state_and_unmanaged_checkpoints(tmp_path):
    """MGR-07: unmanaged checkpoints become latest but are never listed or deleted."""
    ckpt = Checkpoint(v=f32(1))
    ckpt.save(tmp_path / "unusual_prefix")
    ckpt.save(tmp_path / "unusual_prefix")
    mgr = CheckpointManager(Checkpoint(v=f32(0)), tmp_path, max_to_keep=1)
    assert mgr.latest_checkpoint == str(tmp_path / "unusual_prefix-2")
    assert mgr.checkpoints == []
    mgr.checkpoint.restore(mgr.latest_checkpoint)
    mgr.save()
    mgr.save()
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-4"]
    assert (tmp_path / "unusual_prefix-1.index").exists()
    again = CheckpointManager(Checkpoint(), tmp_path, max_to_keep=1)
    assert again.checkpoints == mgr.checkpoints and again.latest_checkpoint == mgr.checkpoints[-1]


def test_mgr08_keep_every_n_hours(tmp_path, clock):
    """MGR-08: a checkpoint leaving the active set after >= n hours stays on disk."""
    mgr = CheckpointManager(
        Checkpoint(v=f32(1)), tmp_path, max_to_keep=1, keep_checkpoint_every_n_hours=1.0
    )
    clock.t += 1800
    mgr.save()  # t0 + 0.5h
    clock.t += 1800
    mgr.save()  # t0 + 1h: ckpt-1 leaves: 0.5h since last preserved -> deleted
    clock.t += 3600
    mgr.save()  # ckpt-2 leaves: 1h since last preserved -> kept
    clock.t += 60
    mgr.save()  # ckpt-3 leaves: 1h after ckpt-2 preserved -> kept? 1h exactly -> kept
    assert not (tmp_path / "ckpt-1.index").exists()
    assert (tmp_path / "ckpt-2.index").exists() and (tmp_path / "ckpt-3.index").exists()
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-4"]
    assert read_checkpoint_state(tmp_path).last_preserved_timestamp == 1_000_000.0 + 3600 * 2


def test_mgr09_clock_behind_last_preserved(tmp_path, clock, caplog):
    """MGR-09: warning and clamped timestamps; nothing deleted by mistake."""
    mgr = CheckpointManager(
        Checkpoint(v=f32(1)), tmp_path, max_to_keep=2, keep_checkpoint_every_n_hours=1.0
    )
    mgr.save()
    mgr.save()
    clock.t -= 50_000
    with caplog.at_level(logging.WARNING, logger="shardpoint"):
        later = CheckpointManager(
            Checkpoint(v=f32(1)), tmp_path, max_to_keep=2, keep_checkpoint_every_n_hours=1.0
        )
    assert "seconds behind the last preserved checkpoint timestamp" in caplog.text
    # as TensorFlow: only checkpoints newer than last_preserved_timestamp are taken over, and
    # after the clock went back none are, so later saves never delete the earlier ones
    assert later.checkpoints == []
    assert later.latest_checkpoint is not None and later.latest_checkpoint.endswith("ckpt-2")
    later.checkpoint.restore(later.latest_checkpoint)  # numbering continues at 3
    for _ in range(4):
        clock.t += 10
        later.save()
    assert (tmp_path / "ckpt-1.index").exists() and (tmp_path / "ckpt-2.index").exists()
    assert [os.path.basename(p) for p in later.checkpoints] == ["ckpt-5", "ckpt-6"]
    assert not (tmp_path / "ckpt-3.index").exists()  # its own saves are managed as usual


def test_mgr09b_takes_over_only_checkpoints_newer_than_last_preserved(tmp_path, clock):
    """Preserved checkpoints (keep_checkpoint_every_n_hours) stay listed in the state file
    only while newer than last_preserved_timestamp; a new manager takes over just those."""
    mgr = CheckpointManager(
        Checkpoint(v=f32(1)), tmp_path, max_to_keep=3, keep_checkpoint_every_n_hours=None
    )
    for _ in range(3):
        clock.t += 100
        mgr.save()
    again = CheckpointManager(Checkpoint(v=f32(1)), tmp_path, max_to_keep=3)
    assert again.checkpoints == mgr.checkpoints  # all newer than the preserved timestamp
    from shardpoint.objgraph.checkpoint_state import read_checkpoint_state as read_state
    from shardpoint.objgraph.checkpoint_state import update_checkpoint_state as write_state

    st = read_state(tmp_path)
    stamps = list(st.all_model_checkpoint_timestamps)
    # pretend ckpt-1 was preserved at its own time: it is no longer the manager's to delete
    write_state(
        str(tmp_path),
        st.model_checkpoint_path,
        list(st.all_model_checkpoint_paths),
        stamps,
        stamps[0],
    )
    third = CheckpointManager(Checkpoint(v=f32(1)), tmp_path, max_to_keep=1)
    assert [os.path.basename(p) for p in third.checkpoints] == ["ckpt-2", "ckpt-3"]
    clock.t += 100
    third.save()
    assert (tmp_path / "ckpt-1.index").exists()
    assert not (tmp_path / "ckpt-2.index").exists()


def test_mgr10b_last_checkpoint_step_constructor_argument(tmp_path):
    step = Variable(np.int64(5))
    mgr = CheckpointManager(
        Checkpoint(step=step),
        tmp_path,
        step_counter=step,
        checkpoint_interval=3,
        last_checkpoint_step=4,
    )
    assert mgr.last_checkpoint_step == 4
    assert mgr.save() is None  # 5 < 4 + 3
    step.assign(7)
    assert mgr.save() is not None and mgr.last_checkpoint_step == 7


def test_mgr10_checkpoint_interval(tmp_path):
    """MGR-10: steps 0..5 with interval 2 -> writes at 0, 2, 4; same step never; force."""
    step = Variable(np.int64(0))
    mgr = CheckpointManager(
        Checkpoint(step=step), tmp_path, max_to_keep=None, step_counter=step, checkpoint_interval=2
    )
    results = []
    for s in range(6):
        step.assign(s)
        results.append(mgr.save())
    written = [s for s, r in enumerate(results) if r is not None]
    assert written == [0, 2, 4]
    assert mgr.save() is None  # step 5 < 4 + 2
    forced = mgr.save(check_interval=False)
    assert forced is not None and forced.endswith("ckpt-4")
    assert mgr.save(check_interval=False) is None  # the same step is never saved twice
    # last_checkpoint_step seeds the interval check
    mgr.last_checkpoint_step = 10
    step.assign(11)
    assert mgr.save() is None
    step.assign(12)
    assert mgr.save().endswith("ckpt-5")


def test_mgr11_restore_or_initialize(tmp_path):
    """MGR-11: restores latest and returns its path, else calls init_fn and returns None."""
    calls = []
    step = Variable(np.int64(3))
    ckpt = Checkpoint(step=step)
    mgr = CheckpointManager(
        ckpt,
        tmp_path,
        step_counter=step,
        checkpoint_interval=5,
        init_fn=lambda: calls.append(1),
    )
    assert mgr.restore_or_initialize() is None and calls == [1]
    path = mgr.save()
    step.assign(99)
    fresh_step = Variable(np.int64(0))
    mgr2 = CheckpointManager(
        Checkpoint(step=fresh_step),
        tmp_path,
        step_counter=fresh_step,
        checkpoint_interval=5,
        init_fn=lambda: calls.append(2),
    )
    assert mgr2.restore_or_initialize() == path and calls == [1]
    assert int(fresh_step) == 3 and mgr2.last_checkpoint_step == 3
    fresh_step.assign(4)
    assert mgr2.save() is None  # within the interval of the restored step


# --- crash safety ---------------------------------------------------------------------------


class Boom(Exception):
    pass


def assert_latest_is_complete(directory, expected_value):
    latest = latest_checkpoint(directory)
    assert latest is not None
    v = f32(0)
    Checkpoint(v=v).read(latest).expect_partial()
    assert float(np.asarray(v)) in expected_value


@pytest.mark.parametrize("crash_at", ["write", "state", "delete"])
def test_crash_during_manager_save_keeps_latest_complete(tmp_path, monkeypatch, crash_at):
    """A crash at any step of save or of the sweep leaves latest_checkpoint complete."""
    v = f32(1)
    mgr = CheckpointManager(Checkpoint(v=v), tmp_path, max_to_keep=2)
    mgr.save()
    v.assign(np.float32(2))
    mgr.save()
    v.assign(np.float32(3))
    if crash_at == "write":
        real_save = storage_io.storage.save_file

        def torn_write(values, prefix, **kw):
            real_save(values, prefix, **kw)
            os.unlink(prefix + ".index")  # as if the process died before the index rename
            raise Boom

        monkeypatch.setattr(storage_io.storage, "save_file", torn_write)
    elif crash_at == "state":

        def torn_state(directory, state):
            raise Boom

        monkeypatch.setattr(checkpoint_state, "write_checkpoint_state", torn_state)
    else:

        def torn_remove(prefix):
            os.unlink(prefix + ".index")  # index goes first, then we "die"
            raise Boom

        monkeypatch.setattr(storage_io, "remove_checkpoint", torn_remove)
    with pytest.raises(Boom):
        mgr.save()
    monkeypatch.undo()
    assert_latest_is_complete(tmp_path, {2.0, 3.0})
    state = read_checkpoint_state(tmp_path)
    listed = [os.path.join(str(tmp_path), p) for p in state.all_model_checkpoint_paths]
    assert all(os.path.exists(p + ".index") for p in listed)
    # the next manager carries on normally
    again = CheckpointManager(Checkpoint(v=f32(0)), tmp_path, max_to_keep=2)
    again.checkpoint.restore(again.latest_checkpoint)
    again.save()
    assert_latest_is_complete(tmp_path, {2.0, 3.0})
