"""save/write/numbering (SAVE-01 … 09), restore and matching (RES-01 … 15), errors (ERR-01 … 06)."""

from __future__ import annotations

import collections
import logging
import os

import numpy as np
import pytest

from shardpoint.errors import NotFoundError
from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.checkpoint_reader import list_variables
from shardpoint.objgraph.checkpoint_state import (
    latest_checkpoint,
    read_checkpoint_state,
    update_checkpoint_state,
)
from shardpoint.objgraph.errors import (
    DTypeMismatchError,
    DuplicateDependencyError,
    LoadStatusError,
    NotTrackableError,
    ShapeMismatchError,
    StatePathConflictError,
)
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.variables import Variable


def f32(x):
    return Variable(np.asarray(x, dtype=np.float32))


def val(v):
    return np.asarray(v).tolist()


def keys_of(path):
    return [k for k, _ in list_variables(path)]


# --- SAVE -----------------------------------------------------------------------------------


def test_save01_counter_incremented_before_write_returns_numbered_path(tmp_path):
    """SAVE-01."""
    ckpt = Checkpoint(v=f32(1))
    first = ckpt.save(tmp_path / "p")
    assert first == os.path.join(str(tmp_path), "p-1") and int(ckpt.save_counter) == 1
    assert ckpt.save(tmp_path / "p").endswith("p-2")
    assert ckpt.save_counter.dtype == np.int64


def test_save02_state_file_names_only_this_checkpoint(tmp_path):
    """SAVE-02: relative paths, a single entry, no timestamps."""
    ckpt = Checkpoint(v=f32(1))
    ckpt.save(tmp_path / "p")
    ckpt.save(tmp_path / "p")
    text = (tmp_path / "checkpoint").read_text()
    assert text == 'model_checkpoint_path: "p-2"\nall_model_checkpoint_paths: "p-2"\n'


def test_save03_plain_save_never_deletes(tmp_path):
    """SAVE-03: ten saves, ten checkpoints on disk, state lists the latest only."""
    ckpt = Checkpoint(v=f32(1))
    for _ in range(10):
        ckpt.save(tmp_path / "c")
    assert all((tmp_path / f"c-{i}.index").exists() for i in range(1, 11))
    state = read_checkpoint_state(tmp_path)
    assert state.all_model_checkpoint_paths == ["c-10"]


def test_save04_write_is_exact_and_counter_free(tmp_path):
    """SAVE-04: no suffix, counter untouched, no state file, counter saved only if it exists."""
    ckpt = Checkpoint(v=f32(2))
    path = ckpt.write(tmp_path / "w")  # PathLike accepted
    assert path == str(tmp_path / "w") and not (tmp_path / "checkpoint").exists()
    assert "save_counter/.ATTRIBUTES/VARIABLE_VALUE" not in keys_of(path)
    assert ckpt._sp_save_counter is None
    _ = ckpt.save_counter
    assert "save_counter/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(ckpt.write(tmp_path / "w2"))
    assert int(ckpt.save_counter) == 0


def test_save05_files_and_parent_directories(tmp_path):
    """SAVE-05: <prefix>.index plus data files; missing parents are created."""
    path = Checkpoint(v=f32(1)).write(tmp_path / "a" / "b" / "w")
    names = os.listdir(tmp_path / "a" / "b")
    assert "w.index" in names and any(n.startswith("w.data-") for n in names)
    assert path.endswith("w")


def test_save06_reading_save_counter_creates_it():
    """SAVE-06."""
    ckpt = Checkpoint()
    assert ckpt._sp_save_counter is None
    assert int(ckpt.save_counter) == 0
    assert "save_counter" in ckpt._sp_children()


def test_save07_restore_continues_numbering_and_overwrites(tmp_path):
    """SAVE-07: restore ckpt-3 -> next save ckpt-4; restore ckpt-1 -> next save reuses ckpt-2."""
    ckpt = Checkpoint(v=f32(1))
    for _ in range(3):
        ckpt.save(tmp_path / "n")
    fresh = Checkpoint(v=f32(0))
    fresh.restore(tmp_path / "n-3")
    assert fresh.save(tmp_path / "n").endswith("n-4")
    again = Checkpoint(v=f32(5))
    again.restore(tmp_path / "n-1")
    again.v.assign(np.float32(5))
    assert again.save(tmp_path / "n").endswith("n-2")
    check = Checkpoint(v=f32(0))
    check.restore(tmp_path / "n-2")
    assert val(check.v) == 5.0


def test_save08_graph_grows_between_saves(tmp_path):
    """SAVE-08: each save reflects the graph then; older restores leave new variables alone."""
    m = Module()
    m.a = f32(1)
    ckpt = Checkpoint(m=m)
    old = ckpt.save(tmp_path / "g")
    m.b = f32(2)
    new = ckpt.save(tmp_path / "g")
    assert "m/b/.ATTRIBUTES/VARIABLE_VALUE" not in keys_of(old)
    assert "m/b/.ATTRIBUTES/VARIABLE_VALUE" in keys_of(new)
    m.a.assign(np.float32(10))
    m.b.assign(np.float32(20))
    ckpt.restore(old)
    assert val(m.a) == 1.0 and val(m.b) == 20.0


def test_save09_state_path_conflict_only_for_direct_update(tmp_path):
    """SAVE-09: save('dir/checkpoint') writes checkpoint-1; a direct conflicting update raises."""
    ckpt = Checkpoint(v=f32(1))
    path = ckpt.save(tmp_path / "checkpoint")
    assert path.endswith("checkpoint-1") and latest_checkpoint(tmp_path) == path
    with pytest.raises(StatePathConflictError, match="conflicts with path used for checkpoint"):
        update_checkpoint_state(tmp_path, str(tmp_path / "checkpoint"))
    with pytest.raises(RuntimeError):
        update_checkpoint_state(tmp_path, str(tmp_path / "checkpoint"))


# --- RES ------------------------------------------------------------------------------------


def test_res01_existing_objects_restored_immediately(tmp_path):
    """RES-01: values arrive at restore() time, before any assertion."""
    m = Module()
    m.inner = Module()
    m.inner.w = f32([1.0, 2.0])
    path = Checkpoint(m=m).write(tmp_path / "r")
    m2 = Module()
    m2.inner = Module()
    m2.inner.w = f32([0.0, 0.0])
    Checkpoint(m=m2).read(path)
    assert val(m2.inner.w) == [1.0, 2.0]


def test_res02_deferred_restore_on_attribute_assignment(tmp_path):
    """RES-02: a missing dependency is restored with its subtree when attached."""
    m = Module()
    m.inner = Module()
    m.inner.deeper = Module()
    m.inner.deeper.v = f32(7.5)
    path = Checkpoint(m=m).write(tmp_path / "r")
    m2 = Module()
    status = Checkpoint(m=m2).read(path)
    inner = Module()
    inner.deeper = Module()
    inner.deeper.v = f32(0)
    m2.inner = inner  # the whole subtree is restored inside this assignment
    assert val(inner.deeper.v) == 7.5
    status.assert_consumed()


def test_res03_value_free_children_are_not_queued(tmp_path):
    """RES-03: children without values anywhere below are never deferred."""
    m = Module()
    m.empty = Module()
    m.empty.deeper = Module()
    m.v = f32(1)
    path = Checkpoint(m=m).write(tmp_path / "r")
    m2 = Module()
    Checkpoint(m=m2).read(path)
    assert "empty" not in m2._sp_state().deferred and "v" in m2._sp_state().deferred


def test_res04_restore_on_create_skips_initializer(tmp_path):
    """RES-04: add_variable while a restore is pending uses the checkpointed value."""
    layer = Module()
    layer.add_variable("kernel", (2,), initializer=lambda s, d: np.full(s, 3.0, d))
    path = Checkpoint(layer=layer).write(tmp_path / "r")
    calls = []

    def init(shape, dtype):
        calls.append(shape)
        return np.zeros(shape, dtype)

    fresh = Module()
    Checkpoint(layer=fresh).read(path)
    kernel = fresh.add_variable("kernel", (2,), initializer=init)
    assert calls == [] and val(kernel) == [3.0, 3.0]
    other = Module()
    other.add_variable("kernel", (2,), initializer=init)
    assert calls == [(2,)]


def test_res05_restore_called_last_wins_any_attach_order(tmp_path):
    """RES-05: two pending restores; the later call wins whatever the attach order."""
    ckpt = Checkpoint(v=f32(0))
    ckpt.v.assign(np.float32(12))
    p12 = ckpt.write(tmp_path / "a")
    ckpt.v.assign(np.float32(13))
    p13 = ckpt.write(tmp_path / "b")
    for order in (("first", "second"), ("second", "first")):
        holder = Checkpoint()
        holder.read(p13)  # called first
        holder.read(p12)  # called last -> wins
        target = f32(0)
        holder.v = target
        assert val(target) == 12.0, order
    # attach one object, then a second restore of older uid must not overwrite
    h = Checkpoint()
    h.read(p13)
    h.read(p12)
    h.v = v = f32(0)
    h2_status = h.read(p13)  # newest now: overwrites (RES-06)
    assert val(v) == 13.0
    h2_status.assert_existing_objects_matched()


def test_res06_new_restore_overwrites_restored_values(tmp_path):
    """RES-06."""
    ckpt = Checkpoint(v=f32(1))
    p1 = ckpt.write(tmp_path / "one")
    ckpt.v.assign(np.float32(2))
    p2 = ckpt.write(tmp_path / "two")
    target = Checkpoint(v=f32(0))
    target.read(p1)
    assert val(target.v) == 1.0
    target.read(p2)
    assert val(target.v) == 2.0


def test_res07_shared_object_restored_through_the_existing_path(tmp_path):
    """RES-07: saved shared by a.v and b.w; program has only b.w."""
    shared = f32([1.0, 2.0])
    a, b = Module(), Module()
    a.v, b.w = shared, shared
    path = Checkpoint(a=a, b=b, zz=shared).write(tmp_path / "s")
    b2 = Module()
    b2.w = f32([0.0, 0.0])
    status = Checkpoint(b=b2).read(path)
    assert val(b2.w) == [1.0, 2.0]
    status.assert_consumed()


def test_res08_shared_in_checkpoint_distinct_in_program(tmp_path, caplog):
    """RES-08: only the first BFS path binds; the others stay unbound, with a warning."""
    shared = f32([3.0])
    a, b = Module(), Module()
    a.v, b.v = shared, shared
    path = Checkpoint(a=a, b=b).write(tmp_path / "s")
    a2, b2 = Module(), Module()
    a2.v, b2.v = f32([0.0]), f32([0.0])
    with caplog.at_level(logging.WARNING, logger="shardpoint"):
        status = Checkpoint(a=a2, b=b2).read(path)
    assert val(a2.v) == [3.0] and val(b2.v) == [0.0]
    assert "Inconsistent references" in caplog.text
    with pytest.raises(LoadStatusError, match=r"Found 1 Python objects .*\(root\)\.b\.v"):
        status.assert_existing_objects_matched()


def test_res09_two_checkpoint_objects_into_one_python_object(tmp_path):
    """RES-09: program aliases dep_two = dep_one; both values restored, assertions pass."""
    m = Module()
    m.dep_one, m.dep_two = f32(1), f32(2)
    path = Checkpoint(m=m).write(tmp_path / "s")
    m2 = Module()
    m2.dep_one = f32(0)
    m2.dep_two = m2.dep_one
    status = Checkpoint(m=m2).read(path)
    assert val(m2.dep_one) == 2.0  # both values written, BFS order: dep_two last
    status.assert_consumed()


def test_res10_lists_dicts_tuples_restore_elementwise(tmp_path):
    """RES-10: append/extend restore by index; dict subset; tuples element-wise."""
    m = Module()
    m.lst = [f32(5), f32(6), f32(7)]
    m.d = {"a": f32(3), "b": f32(4)}
    m.t = (f32(1), f32(2))
    path = Checkpoint(m=m).write(tmp_path / "c")
    m2 = Module()
    status = Checkpoint(m=m2).read(path)
    m2.lst = []
    m2.lst.append(f32(0))
    m2.lst.extend([f32(0)])
    assert [val(v) for v in m2.lst] == [5.0, 6.0]
    with pytest.raises(LoadStatusError, match="lst.2"):
        status.assert_consumed()
    m2.lst.append(f32(0))
    assert val(m2.lst[2]) == 7.0
    m2.d = {"b": f32(0), "zzz": f32(0)}
    assert val(m2.d["b"]) == 4.0 and val(m2.d["zzz"]) == 0.0
    m2.t = (f32(0), f32(0))
    assert [val(v) for v in m2.t] == [1.0, 2.0]


def test_res11_restore_none_is_initialization_only(tmp_path):
    """RES-11."""
    v = f32(4)
    status = Checkpoint(v=v).restore(None)
    for assertion in (
        status.assert_consumed,
        status.assert_existing_objects_matched,
        status.assert_nontrivial_match,
    ):
        with pytest.raises(AssertionError, match="No checkpoint specified"):
            assertion()
    assert val(v) == 4.0 and status.expect_partial() is status


def test_res12_missing_path_messages(tmp_path):
    """RES-12: restore adds the missing-suffix hint; read gives the bare error."""
    ckpt = Checkpoint(v=f32(1))
    with pytest.raises(NotFoundError, match=r"missing the checkpoint suffix"):
        ckpt.restore(tmp_path / "nope-1")
    with pytest.raises(FileNotFoundError) as info:
        ckpt.read(tmp_path / "nope-1")
    assert "suffix" not in str(info.value) and "nope-1" in str(info.value)


def test_res13_read_vs_restore_save_counter(tmp_path):
    """RES-13: read never creates save_counter; restore creates (and restores) it."""
    src = Checkpoint(v=f32(1))
    saved = src.save(tmp_path / "s")
    reader_side = Checkpoint(v=f32(0))
    reader_side.read(saved)
    assert reader_side._sp_save_counter is None
    restorer = Checkpoint(v=f32(0))
    restorer.restore(saved)
    assert int(restorer.save_counter) == 1
    written = Checkpoint(v=f32(0)).write(tmp_path / "w")
    unmatched = Checkpoint(v=f32(0))
    status = unmatched.restore(written)
    assert int(unmatched.save_counter) == 0
    with pytest.raises(AssertionError, match="save_counter"):
        status.assert_existing_objects_matched()


def test_res14_attribute_without_saveable_reported_by_assert_consumed(tmp_path):
    """RES-14: value restored into a plain Module -> unused attribute, no error at restore."""
    path = Checkpoint(v=f32(1)).write(tmp_path / "a")
    status = Checkpoint(v=Module()).read(path)
    with pytest.raises(LoadStatusError, match=r"Unused attributes.*\n\(root\)\.v .*VARIABLE_VALUE"):
        status.assert_consumed()


def test_res15_root_and_kwargs_placement_may_differ(tmp_path):
    """RES-15: saved with Checkpoint(model, separate=x); loaded with other layouts."""
    model = Module()
    model.w = f32(1.5)
    path = Checkpoint(model, separate=f32(2.5)).save(tmp_path / "r")
    other = Module()
    other.w = f32(0)
    sep = f32(0)
    Checkpoint(other, separate=sep).restore(path).assert_consumed()
    assert val(other.w) == 1.5 and val(sep) == 2.5
    w2, sep2 = f32(0), f32(0)
    Checkpoint(w=w2, separate=sep2).restore(path).assert_consumed()
    assert val(w2) == 1.5 and val(sep2) == 2.5


# --- ERR ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [3, "s", 1.0, None, {1, 2}, collections.defaultdict(list), (1, 2), object()],
    ids=["int", "str", "float", "None", "set", "defaultdict", "tuple", "object"],
)
def test_err01_checkpoint_kwarg_must_be_trackable(bad):
    """ERR-01 (None as a kwarg too; root=None means 'no root')."""
    with pytest.raises(ValueError, match="`Checkpoint` was expecting x to be a trackable"):
        Checkpoint(x=bad)
    if bad is not None:
        with pytest.raises(NotTrackableError, match="expecting root"):
            Checkpoint(bad)


def test_err02_kwarg_conflicting_with_root_attribute():
    """ERR-02: different object -> error; same object -> allowed."""
    root = Module()
    root.v = f32(1)
    with pytest.raises(DuplicateDependencyError, match="keyword argument v if root.v"):
        Checkpoint(root, v=f32(2))
    Checkpoint(root, v=root.v)


def test_err03_shape_mismatch_raised_by_restore(tmp_path):
    """ERR-03."""
    path = Checkpoint(v=f32([1.0, 2.0])).write(tmp_path / "s")
    target = f32([0.0])
    with pytest.raises(ShapeMismatchError, match=r"shape \(2,\) .* shape \(1,\)"):
        Checkpoint(v=target).read(path)
    with pytest.raises(ValueError, match=r"\(2, 1\)"):
        Checkpoint(v=Variable(np.zeros((2, 1), np.float32))).read(path)
    assert val(target) == [0.0]


def test_err04_shape_mismatch_at_deferred_attach(tmp_path):
    """ERR-04: raised inside the attribute assignment."""
    path = Checkpoint(v=f32([1.0, 2.0])).write(tmp_path / "s")
    holder = Checkpoint()
    holder.read(path)
    with pytest.raises(ShapeMismatchError, match=r"\(3,\)"):
        holder.v = f32([0.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float16])
def test_err05_dtype_mismatch_no_silent_cast(tmp_path, dtype):
    """ERR-05: float32 in file -> other dtype raises, naming the key and both dtypes."""
    path = Checkpoint(v=f32(1.0)).write(tmp_path / "s")
    with pytest.raises(DTypeMismatchError, match=r"v/\.ATTRIBUTES/VARIABLE_VALUE.*float32"):
        Checkpoint(v=Variable(np.zeros((), dtype))).read(path)


def test_err06_sets_are_ignored_not_errors(tmp_path):
    """ERR-06 (deliberate difference): Variables hash by identity, so a set of them can be
    built; like every set it is a plain attribute and never saved."""
    m = Module()
    v = f32(1)
    m.s = {v}
    m.v = v
    assert v in m.s
    path = Checkpoint(m=m).write(tmp_path / "s")
    assert [k for k in keys_of(path) if not k.startswith("_")] == ["m/v/.ATTRIBUTES/VARIABLE_VALUE"]


def test_packed_float4_variable_restores(tmp_path):
    """Issue 33 (found by shardpoint.testing's CheckpointManagerMachine): a Variable of packed
    float4 saved as float4_e2m1fn_x2 but declared uint8 on restore (DTypeMismatchError)."""
    from shardpoint.dtypes import PACKED_FP4

    codes = np.arange(256, dtype=np.uint8).view(PACKED_FP4)
    Checkpoint(v=Variable(codes)).write(str(tmp_path / "ck"))
    fresh = Checkpoint(v=Variable(np.zeros(256, np.uint8).view(PACKED_FP4)))
    fresh.read(str(tmp_path / "ck")).assert_consumed()
    assert fresh.v.numpy().tobytes() == codes.tobytes()
