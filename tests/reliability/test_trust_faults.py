"""Issue 12 items 10 and 11: injected fsync failures and a file system without ``flock``.

An ``LD_PRELOAD`` shim (compiled here with the system C compiler) makes ``flock`` fail with
ENOSYS, or ``fsync`` fail with EIO on the files whose path contains a given text, or on
directories. Each case runs in a child process; afterwards the directory must hold exactly the
files of one intact checkpoint (the previous one when the save failed before its commit, the
new one otherwise): no temp shard, temp index, unreferenced shard or lock file is leaked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers.fault_shim import build_shim

_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import shardpoint as sp
    p, step = sys.argv[1], int(sys.argv[2])
    state = {f"w{i}": np.full(5000, step, np.float32) for i in range(4)}
    state["step"] = step
    try:
        sp.save_file(state, p, shards=2)
        print("ok")
    except sp.CheckpointError as e:
        print("raised", type(e).__name__, e)
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return build_shim(str(tmp_path_factory.mktemp("shim")))


def _save_in_child(shim: str, p: str, step: int, **faults: str) -> str:
    env = dict(os.environ, LD_PRELOAD=shim, **faults)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, p, str(step)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _assert_only_checkpoint(d: str, p: str, step: int) -> None:
    """``p`` holds ``step``'s values and nothing but its index and shards is in ``d``."""
    with sp.open(p) as r:
        r.verify()
        assert r["step"] == step
        np.testing.assert_array_equal(r["w3"], np.full(5000, step, np.float32))
        shards = {os.path.basename(f) for f, _ in r.format_info["shards"]}
    base = os.path.basename(p)
    assert set(os.listdir(d)) == {base + ".index"} | shards, sorted(os.listdir(d))


def test_shim_injects(shim, tmp_path):
    """The shim really fails what it claims to (else the cases below prove nothing)."""
    code = "import fcntl,os,sys; f=os.open(sys.argv[1],os.O_RDONLY)\ntry:\n fcntl.flock(f,fcntl.LOCK_EX)\nexcept OSError as e: print(e.errno)"
    env = dict(os.environ, LD_PRELOAD=shim, SP_FAULT_FLOCK="1")
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert out.stdout.strip() == "38"  # ENOSYS


def test_no_flock_saves_keep_working_and_leak_nothing(shim, tmp_path):
    d, p = str(tmp_path), str(tmp_path / "ck")
    for step in range(1, 5):
        assert _save_in_child(shim, p, step, SP_FAULT_FLOCK="1") == "ok"
        _assert_only_checkpoint(d, p, step)
    sp.remove(p)  # without a lock too
    assert os.listdir(d) == []


@pytest.mark.parametrize(
    "fault",
    [
        {"SP_FAULT_FSYNC": ".data-"},  # a shard's fsync
        {"SP_FAULT_FSYNC": ".index.tmp-"},  # the index's fsync, shards already published
    ],
    ids=["shard-fsync", "index-fsync"],
)
def test_failed_fsync_raises_and_leaves_the_previous_checkpoint_only(shim, tmp_path, fault):
    d, p = str(tmp_path), str(tmp_path / "ck")
    assert _save_in_child(shim, p, 1) == "ok"
    out = _save_in_child(shim, p, 2, **fault)
    assert out.startswith("raised CheckpointIOError") and "fsync" in out, out
    _assert_only_checkpoint(d, p, 1)


def test_failed_directory_fsync_after_commit_is_reported_and_nothing_is_lost(shim, tmp_path):
    d, p = str(tmp_path), str(tmp_path / "ck")
    assert _save_in_child(shim, p, 1) == "ok"
    out = _save_in_child(shim, p, 2, SP_FAULT_FSYNC_DIR="1")
    assert out.startswith("raised CheckpointIOError") and "may not survive" in out, out
    # the new checkpoint is in place; its shards were not cleaned away, the old ones are
    # removed by the next successful commit
    with sp.open(p) as r:
        r.verify()
        assert r["step"] == 2
    assert _save_in_child(shim, p, 3) == "ok"
    _assert_only_checkpoint(d, p, 3)
