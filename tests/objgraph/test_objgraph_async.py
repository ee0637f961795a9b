"""Asynchronous and incremental saves of the object graph (issue 13): ``Checkpoint.save/write``
and ``CheckpointManager.save`` with ``blocking=False``, ``manager.wait()``, ``incremental=True``."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest

import shardpoint as sp
from shardpoint import storage
from shardpoint.storage.async_save import SaveFuture


def _vars(seed: int = 0) -> tuple[sp.Variable, sp.Variable, sp.Variable]:
    rng = np.random.default_rng(seed)
    return (
        sp.Variable(rng.standard_normal((512, 1024)).astype(np.float32)),  # 2 MiB
        sp.Variable(rng.standard_normal((1200, 1024)).astype(np.float32)),  # 4.7 MiB: own shard
        sp.Variable(np.int64(5)),
    )


def _restored(path: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in sp.load_file(path).items() if isinstance(v, np.ndarray)}


class _Gate:
    """Holds every background write until ``open()``; counts the writes that started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.event = threading.Event()
        self.started = 0
        real = storage.SavePlan.write

        def write(plan, items, crcs):  # noqa: ANN001
            if threading.current_thread() is not threading.main_thread():
                self.started += 1
                assert self.event.wait(60)
            return real(plan, items, crcs)

        monkeypatch.setattr(storage.SavePlan, "write", write)

    def open(self) -> None:
        self.event.set()


def test_checkpoint_save_and_write_nonblocking_snapshot(tmp_path):
    a, b, n = _vars()
    ck = sp.Checkpoint(a=a, b=b, n=n)
    want_a, want_b = a.numpy().copy(), b.numpy().copy()
    fut = ck.save(str(tmp_path / "ck"), blocking=False)
    assert isinstance(fut, Future)
    a.assign(np.zeros_like(want_a))
    b.assign_add(np.ones_like(want_b))
    n.assign(99)
    path = fut.result(60)
    assert path == str(tmp_path / "ck-1") and sp.latest_checkpoint(str(tmp_path)) == path
    ck2 = sp.Checkpoint(
        a=sp.Variable(np.zeros_like(want_a)),
        b=sp.Variable(np.zeros_like(want_b)),
        n=sp.Variable(np.int64(0)),
    )
    ck2.restore(path).assert_consumed()
    assert ck2.a.numpy().tobytes() == want_a.tobytes()
    assert ck2.b.numpy().tobytes() == want_b.tobytes()
    assert int(ck2.n.numpy()) == 5
    w = ck.write(str(tmp_path / "plain"), blocking=False)
    assert w.result(60) == str(tmp_path / "plain")
    ck.wait()


def test_tensorflow_style_options_ask_for_async(tmp_path):
    a, b, n = _vars()
    ck = sp.Checkpoint(a=a)
    opts = SimpleNamespace(experimental_enable_async_checkpoint=True)
    fut = ck.write(str(tmp_path / "w"), options=opts)
    assert isinstance(fut, SaveFuture) and fut.result(60) == str(tmp_path / "w")


def test_manager_latest_names_only_committed_and_rotates_after_commit(tmp_path, monkeypatch):
    a, b, n = _vars()
    ck = sp.Checkpoint(a=a, b=b, n=n)
    mgr = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=1)
    first = mgr.save()
    gate = _Gate(monkeypatch)
    fut = mgr.save(blocking=False)
    deadline = time.time() + 30
    while gate.started == 0 and time.time() < deadline:
        time.sleep(0.01)
    assert gate.started == 1 and not fut.done()
    # Not committed yet: latest is still the first, which rotation has not deleted.
    assert mgr.latest_checkpoint == first and sp.latest_checkpoint(str(tmp_path)) == first
    assert mgr.checkpoints == [first] and os.path.exists(first + ".index")
    gate.open()
    second = fut.result(60)
    assert second == str(tmp_path / "ckpt-2")
    assert mgr.latest_checkpoint == second == sp.latest_checkpoint(str(tmp_path))
    assert mgr.checkpoints == [second] and not os.path.exists(first + ".index")


def test_manager_saves_commit_in_call_order_and_snapshot(tmp_path):
    a, b, n = _vars()
    ck = sp.Checkpoint(a=a, n=n)
    mgr = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=3, max_in_flight=2)
    assert ck.max_in_flight == 2
    futs = []
    for i in range(5):
        a.assign(np.full(a.shape, i, np.float32))
        n.assign(i)
        futs.append(mgr.save(blocking=False))
    a.assign(np.full(a.shape, -1, np.float32))
    paths = [f.result(120) for f in futs]
    mgr.wait()
    assert paths == [str(tmp_path / f"ckpt-{i}") for i in range(1, 6)]
    assert mgr.checkpoints == paths[-3:] and mgr.latest_checkpoint == paths[-1]
    for i, p in enumerate(paths[-3:], start=2):
        got = sp.load_file(p)
        vals = [v for k, v in got.items() if k.startswith("a/")]
        assert len(vals) == 1 and (vals[0] == i).all()


def test_manager_interval_skip_returns_done_future(tmp_path):
    step = sp.Variable(np.int64(0))
    a, _, _ = _vars()
    mgr = sp.CheckpointManager(
        sp.Checkpoint(a=a, step=step), str(tmp_path), step_counter=step, checkpoint_interval=10
    )
    assert mgr.save(blocking=False).result(60) == str(tmp_path / "ckpt-1")
    step.assign(3)
    skipped = mgr.save(blocking=False)
    assert skipped.done() and skipped.result() is None


def test_manager_errors_surface_on_result_next_save_and_wait(tmp_path, monkeypatch):
    a, b, n = _vars()
    ck = sp.Checkpoint(a=a)
    mgr = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=2)
    good = mgr.save()
    real = storage.SavePlan.write
    fail = {"on": True}

    def write(plan, items, crcs):  # noqa: ANN001
        if fail["on"]:
            raise OSError(28, "No space left on device")
        return real(plan, items, crcs)

    monkeypatch.setattr(storage.SavePlan, "write", write)
    f = mgr.save(blocking=False)
    with pytest.raises(OSError, match="No space"):
        f.result(60)
    assert mgr.latest_checkpoint == good  # the failed save is not named
    # Not observed: raised by the next save (which does not start) ...
    g = mgr.save(blocking=False)
    deadline = time.time() + 60
    while not g.done() and time.time() < deadline:
        time.sleep(0.01)
    number = int(ck.save_counter)
    with pytest.raises(OSError, match="No space"):
        mgr.save(blocking=False)
    assert int(ck.save_counter) == number  # raised before the save was counted
    # ... and by wait().
    mgr.save(blocking=False)
    with pytest.raises(OSError, match="No space"):
        mgr.wait(60)
    mgr.wait(60)
    fail["on"] = False
    ok = mgr.save(blocking=False).result(60)
    assert mgr.latest_checkpoint == ok == sp.latest_checkpoint(str(tmp_path))


def test_blocking_save_after_async_keeps_order(tmp_path):
    a, _, _ = _vars()
    ck = sp.Checkpoint(a=a)
    mgr = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=None)
    f = mgr.save(blocking=False)
    p2 = mgr.save()  # waits for the asynchronous one first
    assert f.done() and mgr.checkpoints == [f.result(), p2]


# ---- incremental ----------------------------------------------------------------------------------


def _files_of(p: str) -> list[str]:
    d, b = os.path.split(p)
    return [os.path.join(d, n) for n in os.listdir(d) if n.startswith(b + ".")]


def _inodes(prefix: str) -> set[int]:
    return {os.stat(p).st_ino for p in _files_of(prefix)}


def _new_bytes(prefix: str, seen: set[int]) -> int:
    """Bytes of ``prefix``'s files that are not (hard links of) files with inodes ``seen``."""
    return sum(os.path.getsize(p) for p in _files_of(prefix) if os.stat(p).st_ino not in seen)


@pytest.mark.parametrize("blocking", [True, False])
def test_incremental_manager_writes_only_changed_values(tmp_path, blocking):
    rng = np.random.default_rng(3)
    frozen = [sp.Variable(rng.standard_normal((1024, 1024)).astype(np.float32)) for _ in range(4)]
    lora = sp.Variable(rng.standard_normal((64, 1024)).astype(np.float32))
    ck = sp.Checkpoint(frozen=frozen, lora=lora)
    full_dir, inc_dir = tmp_path / "full", tmp_path / "inc"
    full = sp.CheckpointManager(
        sp.Checkpoint(frozen=frozen, lora=lora), str(full_dir), max_to_keep=1
    )
    inc = sp.CheckpointManager(ck, str(inc_dir), max_to_keep=1, incremental=True)
    for m in (full, inc):
        r = m.save(blocking=blocking)
        if not blocking:
            r.result(60)
    for _ in range(3):
        lora.assign_add(np.full(lora.shape, 0.5, np.float32))
        prev = inc.latest_checkpoint
        assert prev is not None
        seen = _inodes(prev)
        r = inc.save(blocking=blocking)
        p = r if blocking else r.result(60)
        full.save()
        total = sum(v.numpy().nbytes for v in frozen) + lora.numpy().nbytes
        assert _new_bytes(p, seen) < 0.1 * total
        # max_to_keep=1 deleted the base: the new checkpoint is intact and equal to a full save
        assert not os.path.exists(prev + ".index")
        with sp.open(p) as rd:
            rd.verify()
        got_inc, got_full = sp.load_file(p), sp.load_file(full.latest_checkpoint)
        assert set(got_inc) == set(got_full)
        for k in got_full:
            x, y = got_full[k], got_inc[k]
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), k
            elif k != "_CHECKPOINTABLE_OBJECT_GRAPH":
                assert x == y, k


def test_incremental_after_restart_uses_the_restored_latest(tmp_path):
    rng = np.random.default_rng(4)
    w = sp.Variable(rng.standard_normal((1024, 1280)).astype(np.float32))
    s = sp.Variable(np.int64(0))
    sp.CheckpointManager(sp.Checkpoint(w=w, s=s), str(tmp_path), incremental=True).save()
    # a new process: new objects, a new manager over the same directory
    w2 = sp.Variable(np.zeros((1024, 1280), np.float32))
    s2 = sp.Variable(np.int64(0))
    ck = sp.Checkpoint(w=w2, s=s2)
    m = sp.CheckpointManager(ck, str(tmp_path), incremental=True)
    m.restore_or_initialize()
    s2.assign(1)
    p = m.save()
    with sp.open(p) as r:
        assert r.format_info["incremental"]["linked_bytes"] == w.numpy().nbytes
