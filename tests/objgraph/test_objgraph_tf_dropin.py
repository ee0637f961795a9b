"""TensorFlow behaviours users rely on: add_variable name clashes, weak-reference roots,
variables as tuples, and every file and mapping closed once a restore or reader is done."""

from __future__ import annotations

import gc
import os
import weakref

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.checkpoint_reader import load_checkpoint
from shardpoint.objgraph.errors import DuplicateDependencyError
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.variables import Variable


class Net(Module):
    def __init__(self, seed: float = 0.0) -> None:
        super().__init__()
        self.w = Variable(np.full((4, 3), seed, np.float32))
        self.b = Variable(np.full((3,), seed, np.float32), trainable=False)


# --- add_variable ---------------------------------------------------------------------------


def test_add_variable_with_a_name_in_use_raises_like_tensorflow():
    m = Module()
    first = m.add_variable("v", (2,))
    with pytest.raises(ValueError, match="already declared as a dependency") as info:
        m.add_variable("v", (3,))
    assert isinstance(info.value, DuplicateDependencyError)
    assert "'v'" in str(info.value) and "overwrite=True" in str(info.value)
    assert m.v is first  # nothing replaced
    second = m.add_variable("v", (3,), overwrite=True)
    assert m.v is second and m._sp_lookup("v") is second
    m.other = Variable(np.float32(1))  # any dependency counts, not only add_variable's
    with pytest.raises(DuplicateDependencyError):
        m.add_variable("other", ())


# --- variables as tuples --------------------------------------------------------------------


def test_variables_and_trainable_variables_are_tuples():
    net = Net()
    assert isinstance(net.variables, tuple) and isinstance(net.trainable_variables, tuple)
    assert net.variables == (net.w, net.b)
    assert net.trainable_variables == (net.w,)


# --- weak references as roots ---------------------------------------------------------------


def test_checkpoint_with_weakref_root_saves_and_restores(tmp_path):
    net = Net(1.0)
    ckpt = Checkpoint(root=weakref.ref(net))
    path = ckpt.write(str(tmp_path / "ck"))
    keys = {k for k, _ in sp.list_variables(path)}
    assert "w/.ATTRIBUTES/VARIABLE_VALUE" in keys  # root's dependencies are top level
    fresh = Net(0.0)
    Checkpoint(root=weakref.ref(fresh)).read(path).assert_consumed()
    assert np.array_equal(fresh.w.numpy(), net.w.numpy())


def test_checkpoint_holds_a_weakref_root_weakly(tmp_path):
    net = Net(1.0)
    ckpt = Checkpoint(root=weakref.ref(net))
    probe = weakref.ref(net)
    del net
    gc.collect()
    assert probe() is None  # the Checkpoint did not keep it alive
    with pytest.raises(ValueError, match="garbage-collected"):
        ckpt.write(str(tmp_path / "ck"))


def test_weakref_keyword_values_and_dead_references():
    net = Net()
    ckpt = Checkpoint(model=weakref.ref(net))
    assert ckpt._sp_lookup("model") is net
    dead = weakref.ref(Net())
    gc.collect()
    with pytest.raises(ValueError, match="dead weak reference"):
        Checkpoint(root=dead)


# --- files and mappings closed --------------------------------------------------------------


def _open_files(directory: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(directory):
            out.append(target)
    return out


def _mappings(directory: str) -> list[str]:
    with open("/proc/self/maps") as fh:
        return [line for line in fh if directory in line]


def _handles(directory) -> tuple[int, int]:
    gc.collect()
    d = os.fspath(directory)
    return len(_open_files(d)), len(_mappings(d))


def test_restore_closes_files_and_mappings_when_done(tmp_path):
    net = Net(2.0)
    path = Checkpoint(model=net).save(str(tmp_path / "ck"))
    assert _handles(tmp_path) == (0, 0)
    fresh = Net()
    status = Checkpoint(model=fresh).restore(path)
    # everything restored: nothing may stay open, though the status object is alive
    assert _handles(tmp_path) == (0, 0)
    status.assert_consumed()
    assert np.array_equal(fresh.w.numpy(), net.w.numpy())
    values = fresh.w.numpy()
    del status
    assert _handles(tmp_path) == (0, 0) and values[0, 0] == 2.0


def test_deferred_restore_keeps_no_file_open(tmp_path):
    """TensorFlow's test_ckpt_files_closed_after_restoration: values waiting for objects that
    do not exist yet do not hold the checkpoint's files; attaching an object reopens it for the
    time of that restore only."""
    path = Checkpoint(model=Net(3.0)).save(str(tmp_path / "ck"))
    holder = Module()
    status = Checkpoint(model=holder).restore(path)
    assert _handles(tmp_path) == (0, 0)  # w and b wait for their objects, nothing is open
    holder.w = Variable(np.zeros((4, 3), np.float32))
    assert _handles(tmp_path) == (0, 0)  # b still waits
    assert holder.w.numpy()[0, 0] == 3.0
    holder.b = Variable(np.zeros((3,), np.float32))
    assert _handles(tmp_path) == (0, 0)
    assert holder.b.numpy()[0] == 3.0
    status.assert_existing_objects_matched()


def test_deferred_values_follow_the_checkpoint_files(tmp_path):
    """Nothing is kept open, so the files of a pending restore can be removed or replaced: a
    removed checkpoint raises NotFoundError when the value is claimed, a checkpoint written
    over at the same path raises instead of restoring another save's values."""
    path = Checkpoint(model=Net(3.0)).write(str(tmp_path / "ck"))
    holder = Module()
    Checkpoint(model=holder).restore(path).expect_partial()
    sp.remove(path)  # possible at once: no descriptor holds it
    with pytest.raises(sp.NotFoundError):
        holder.w = Variable(np.zeros((4, 3), np.float32))

    path = Checkpoint(model=Net(3.0)).write(str(tmp_path / "ck2"))
    holder = Module()
    Checkpoint(model=holder).restore(path).expect_partial()
    Checkpoint(model=Net(4.0)).write(path)  # another save at the same prefix
    with pytest.raises(sp.CorruptCheckpointError, match="was replaced since restore"):
        holder.w = Variable(np.zeros((4, 3), np.float32))

    path = Checkpoint(model=Net(3.0)).write(str(tmp_path / "ck3"))
    holder = Module()
    Checkpoint(model=holder).restore(path).expect_partial()
    Checkpoint(model=Net(3.0)).write(path)  # written again with the same values: still fine
    holder.w = Variable(np.zeros((4, 3), np.float32))
    assert holder.w.numpy()[0, 0] == 3.0


def test_unfinished_restore_holds_nothing_open(tmp_path):
    path = Checkpoint(model=Net(3.0)).save(str(tmp_path / "ck"))
    holder = Module()
    status = Checkpoint(model=holder).restore(path)
    status.expect_partial()
    assert _handles(tmp_path) == (0, 0)
    del status, holder
    assert _handles(tmp_path) == (0, 0)


def test_readers_close_files_and_mappings(tmp_path):
    path = Checkpoint(model=Net(1.0)).save(str(tmp_path / "ck"))
    key = "model/w/.ATTRIBUTES/VARIABLE_VALUE"
    with load_checkpoint(path) as reader:
        value = reader.get_tensor(key)
        assert _handles(tmp_path)[0] > 0
    assert _handles(tmp_path) == (0, 1)  # the returned array keeps only its own mapping
    del value
    assert _handles(tmp_path) == (0, 0)
    reader = load_checkpoint(path)
    reader.get_tensor(key)
    del reader  # garbage-collected without close()
    assert _handles(tmp_path) == (0, 0)
    r = sp.open(path)
    r.get_slice(key)[1:3]
    r.load()
    del r
    assert _handles(tmp_path) == (0, 0)
    with sp.open(path) as r:
        r.verify()
    assert _handles(tmp_path) == (0, 0)
    sp.load_file(path)
    assert _handles(tmp_path) == (0, 0)


def test_name_based_restore_closes_its_reader(tmp_path):
    net = Net(5.0)
    sp.save_file(
        {
            "w/.ATTRIBUTES/VARIABLE_VALUE": net.w.numpy(),
            "b/.ATTRIBUTES/VARIABLE_VALUE": net.b.numpy(),
        },
        tmp_path / "plain",
        durable=False,
    )
    fresh = Net()
    status = Checkpoint(root=fresh).restore(str(tmp_path / "plain"))
    assert _handles(tmp_path) == (0, 0)
    status.assert_consumed()
    assert fresh.w.numpy()[0, 0] == 5.0
