"""Issue 12 items 2, 3, 5 (restore), 9 and 13: CheckpointManager under real conditions.

2/3. Two processes open a CheckpointManager on one directory at the same time (two jobs resumed
     from one checkpoint by mistake), round after round: the second is refused with
     ``DirectoryInUseError`` naming the directory, and after every round every listed checkpoint
     verifies and ``restore_or_initialize`` restores the newest.
9.   Deleting an old checkpoint fails (EIO from an LD_PRELOAD shim): ``save()`` still returns
     the committed checkpoint, the failure is logged and retried by a later save (in a new
     process), and nothing stays on disk. A directory fsync failing after the commit raises,
     but the checkpoint is listed and later deleted like any other.
13.  ``restore_or_initialize`` restores the newest intact checkpoint when the newest has no
     index or is damaged, warning with its name; ``strict=True`` raises.
5.   ``Checkpoint.restore`` checks every value's crc32c (``verify=False`` opts out).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers.fault_shim import build_shim

ROUNDS = int(os.environ.get("SHARDPOINT_TRUST_ROUNDS", "24"))

_JOB = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import shardpoint as sp
    d, me, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    other = 3 - me
    def mark(name):
        with open(os.path.join(d, name + ".tmp"), "w") as f:
            f.write("x")
        os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    def wait(name):
        while not os.path.exists(os.path.join(d, name)):
            time.sleep(0.0005)
    for r in range(rounds):
        wait(f"go-{r}")
        ck = sp.Checkpoint(w=sp.Variable(np.zeros(64, np.float32)), step=sp.Variable(0))
        try:
            mgr = sp.CheckpointManager(ck, os.path.join(d, "run"), max_to_keep=2)
        except sp.DirectoryInUseError as e:
            assert os.path.join(d, "run") in str(e), str(e)
            mark(f"refused-{r}-{me}")
            continue
        mark(f"owner-{r}-{me}")
        # hold the directory until the other job has tried, so the two always overlap
        while not (os.path.exists(os.path.join(d, f"refused-{r}-{other}"))
                   or os.path.exists(os.path.join(d, f"owner-{r}-{other}"))):
            time.sleep(0.0005)
        mgr.restore_or_initialize()
        for _ in range(2):
            s = int(ck.step) + 1
            ck.step.assign(s)
            ck.w.assign(np.full(64, s, np.float32))
            mgr.save()
        mgr.close()
        del mgr
        mark(f"done-{r}-{me}")
    """
)


def _wait_any(d: str, names: list[str], procs, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        for n in names:
            if os.path.exists(os.path.join(d, n)):
                return n
        for p in procs:
            if p.poll() not in (None, 0):
                raise AssertionError(f"job exited with {p.returncode}: {p.stderr.read()!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {names}")
        time.sleep(0.001)


def test_two_managers_on_one_directory_second_is_refused(tmp_path):
    d = str(tmp_path)
    os.makedirs(os.path.join(d, "run"))  # jobs resumed into an existing directory
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOB, d, str(me), str(ROUNDS)], stderr=subprocess.PIPE
        )
        for me in (1, 2)
    ]
    step = 0
    try:
        for r in range(ROUNDS):
            open(os.path.join(d, f"go-{r}"), "w").close()
            roles = {}
            for me in (1, 2):
                got = _wait_any(d, [f"owner-{r}-{me}", f"refused-{r}-{me}"], procs)
                roles[me] = got.split("-")[0]
            assert sorted(roles.values()) == ["owner", "refused"], (r, roles)
            owner = next(m for m, role in roles.items() if role == "owner")
            _wait_any(d, [f"done-{r}-{owner}"], procs)
            step += 2
            # the invariant: every listed checkpoint is intact, the newest holds the last step
            ck = sp.Checkpoint(w=sp.Variable(np.zeros(64, np.float32)), step=sp.Variable(0))
            mgr = sp.CheckpointManager(ck, os.path.join(d, "run"), max_to_keep=2)
            assert len(mgr.checkpoints) == 2
            for p in mgr.checkpoints:
                sp.open(p).verify()
            assert mgr.restore_or_initialize() == mgr.checkpoints[-1]
            assert int(ck.step) == step
            np.testing.assert_array_equal(ck.w.numpy(), np.full(64, step, np.float32))
            mgr.close()
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.wait(timeout=60)
    assert [p.returncode for p in procs] == [0, 0]


def test_same_process_managers_share_the_directory(tmp_path):
    ck = sp.Checkpoint(v=sp.Variable(1.0))
    a = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=2)
    a.save()
    b = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=2)  # a resume in one process
    assert b.restore_or_initialize() == a.latest_checkpoint


_DELETE_CHILD = textwrap.dedent(
    """
    import logging, os, sys
    import numpy as np
    import shardpoint as sp
    logging.basicConfig(level=logging.WARNING)
    d, saves, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ck = sp.Checkpoint(w=sp.Variable(np.zeros(8, np.float32)))
    mgr = sp.CheckpointManager(ck, d, max_to_keep=1)
    mgr.restore_or_initialize()
    for i in range(saves):
        if fault == "fsync-dir" and i == 0:
            os.environ["SP_FAULT_FSYNC_DIR"] = "1"
            try:
                mgr.save()
            except sp.CheckpointIOError as e:
                print("RAISED", e)
            del os.environ["SP_FAULT_FSYNC_DIR"]
        else:
            print("SAVED", mgr.save())
    print("LISTED", " ".join(os.path.basename(p) for p in mgr.checkpoints))
    """
)


def _run(shim: str, d: str, saves: int, fault: str = "", **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _DELETE_CHILD, d, str(saves), fault],
        env=dict(os.environ, LD_PRELOAD=shim, **env),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def _checkpoint_files(d: str) -> set[str]:
    return {f for f in os.listdir(d) if f.startswith("ckpt-")}


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return build_shim(str(tmp_path_factory.mktemp("shim")))


def test_failed_deletion_is_logged_retried_and_nothing_leaks(shim, tmp_path):
    d = str(tmp_path)
    _run(shim, d, 1)  # ckpt-1
    out = _run(shim, d, 2, SP_FAULT_UNLINK="ckpt-1.index")  # ckpt-2, ckpt-3: ckpt-1 stuck
    assert "SAVED" in out and "could not delete old checkpoint" in out and "ckpt-1" in out, out
    assert "LISTED ckpt-3" in out
    assert "ckpt-1.index" in _checkpoint_files(d)  # still there: the fault held
    out = _run(shim, d, 1)  # a later save in a new process retries
    assert "LISTED ckpt-4" in out
    with sp.open(os.path.join(d, "ckpt-4")) as r:
        shards = {os.path.basename(f) for f, _ in r.format_info["shards"]}
    assert _checkpoint_files(d) == {"ckpt-4.index"} | shards, sorted(os.listdir(d))


def test_directory_fsync_failure_after_commit_still_lists_the_checkpoint(shim, tmp_path):
    d = str(tmp_path)
    out = _run(shim, d, 3, "fsync-dir")
    assert "RAISED" in out and "may not survive" in out, out
    # ckpt-1's save raised after its commit; it was listed, so retention deleted it later
    assert "LISTED ckpt-3" in out
    with sp.open(os.path.join(d, "ckpt-3")) as r:
        shards = {os.path.basename(f) for f, _ in r.format_info["shards"]}
    assert _checkpoint_files(d) == {"ckpt-3.index"} | shards, sorted(os.listdir(d))


# ---- item 13: resume falls back to the newest intact checkpoint ------------------------------
def _three_saves(d: str) -> tuple[sp.Checkpoint, sp.CheckpointManager]:
    ck = sp.Checkpoint(b=sp.Variable(np.zeros(4, np.float32)))
    mgr = sp.CheckpointManager(ck, d, max_to_keep=3)
    for s in (1, 2, 3):
        ck.b.assign(np.full(4, 42.0 + s, np.float32))
        mgr.save()
    return ck, mgr


def _flip_bias(prefix: str) -> None:
    key = next(k for k in sp.open(prefix).keys() if k.startswith("b/"))
    with sp.open(prefix) as r:
        info = r.info(key)
        [(shard, _)] = r.format_info["shards"]
    with open(shard, "r+b") as f:
        f.seek(info.offset + 3)
        b = f.read(1)[0]
        f.seek(info.offset + 3)
        f.write(bytes([b ^ 1]))


@pytest.mark.parametrize("damage", ["index-missing", "bit-flip", "shard-missing"])
def test_resume_falls_back_to_newest_intact(tmp_path, caplog, damage):
    d = str(tmp_path)
    _, old = _three_saves(d)
    old.close()
    newest = os.path.join(d, "ckpt-3")
    if damage == "index-missing":
        os.unlink(newest + ".index")
    elif damage == "bit-flip":
        _flip_bias(newest)
    else:
        for f in os.listdir(d):
            if f.startswith("ckpt-3.data-"):
                os.unlink(os.path.join(d, f))
    ck = sp.Checkpoint(b=sp.Variable(np.zeros(4, np.float32)))
    mgr = sp.CheckpointManager(ck, d, max_to_keep=3)
    with caplog.at_level(logging.WARNING, logger="shardpoint"):
        assert mgr.restore_or_initialize() == os.path.join(d, "ckpt-2")
    assert ck.b.numpy()[0] == 44.0
    assert "ckpt-3" in caplog.text and "skipping" in caplog.text
    ck2 = sp.Checkpoint(b=sp.Variable(np.zeros(4, np.float32)))
    with pytest.raises(
        sp.CorruptCheckpointError if damage != "shard-missing" else sp.CheckpointError
    ):
        sp.CheckpointManager(ck2, d, max_to_keep=3).restore_or_initialize(strict=True)


def test_resume_without_state_file_finds_numbered_checkpoints(tmp_path):
    d = str(tmp_path)
    _, old = _three_saves(d)
    old.close()
    os.unlink(os.path.join(d, "checkpoint"))
    ck = sp.Checkpoint(b=sp.Variable(np.zeros(4, np.float32)))
    assert sp.CheckpointManager(ck, d).restore_or_initialize() == os.path.join(d, "ckpt-3")
    assert ck.b.numpy()[0] == 45.0


def test_all_damaged_raises_instead_of_starting_from_scratch(tmp_path):
    d = str(tmp_path)
    _, old = _three_saves(d)
    old.close()
    for s in (1, 2, 3):
        _flip_bias(os.path.join(d, f"ckpt-{s}"))
    called = []
    ck = sp.Checkpoint(b=sp.Variable(np.zeros(4, np.float32)))
    mgr = sp.CheckpointManager(ck, d, init_fn=lambda: called.append(1))
    with pytest.raises(sp.CorruptCheckpointError, match="no intact checkpoint"):
        mgr.restore_or_initialize()
    assert not called


# ---- item 5: the restore path checks crcs -----------------------------------------------------
def test_checkpoint_restore_checks_small_raw_values(tmp_path):
    ck = sp.Checkpoint(b=sp.Variable(np.full(4, 42.0, np.float32)))
    p = ck.write(str(tmp_path / "ck"))
    _flip_bias(p)
    fresh = sp.Checkpoint(b=sp.Variable(np.zeros(4, np.float32)))
    with pytest.raises(sp.ChecksumMismatchError):
        fresh.restore(p)
    assert fresh.b.numpy()[0] == 0.0  # nothing damaged was assigned
    fresh.restore(p, verify=False)  # the explicit opt-out
    assert fresh.b.numpy()[0] != 42.0
    with pytest.raises(sp.ChecksumMismatchError):
        sp.load_variable(p, next(k for k in sp.open(p).keys() if k.startswith("b/")))
