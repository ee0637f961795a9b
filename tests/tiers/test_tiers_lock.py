"""One job per tier directory (shardpoint/tiers/lease.py, docs/TIERS.md "Two jobs on one
directory"): while one process has a TieredCheckpointManager, a second process's manager on the
same local directory, or on the same persistent directory, fails in its constructor with
``DirectoryInUseError`` naming the directory, and writes nothing; so does a CheckpointManager on
the persistent directory. Once the first job closes its manager (or exits) the second starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import shardpoint as sp

STEP_2 = [float(x) for x in range(8)]  # what the first job saved at step 2, as printed
# A job: its manager saves step 2, says so, and keeps the manager until told to close it.
FIRST = """
import sys, numpy as np, shardpoint as sp
ck = sp.Checkpoint(w=sp.Variable(np.arange(8, dtype=np.float32)))
m = sp.TieredCheckpointManager(ck, sys.argv[1], local_directory=sys.argv[2], local_every=1,
                               persistent_every=1)
m.save(2)
m.wait()
print("saved", flush=True)
sys.stdin.readline()
m.close()
print("closed", flush=True)
sys.stdin.readline()
"""

# A second job: try to build managers (tiered, or plain on the persistent directory), one
# attempt per argument "persistent|local|kind"; one line per attempt.
SECOND = """
import sys, numpy as np, shardpoint as sp
ck = sp.Checkpoint(w=sp.Variable(np.zeros(8, dtype=np.float32)))
for arg in sys.argv[1:]:
    persistent, local, kind = arg.split("|")
    try:
        if kind == "plain":
            m = sp.CheckpointManager(ck, persistent)
        else:
            m = sp.TieredCheckpointManager(ck, persistent, local_directory=local)
            print("restored", m.restore_or_initialize(), ck.w.numpy().tolist())
    except sp.DirectoryInUseError as e:
        print("refused", e)
"""


def _second(*attempts: tuple[Path, Path, str]) -> list[str]:
    args = [f"{p}|{q}|{kind}" for p, q, kind in attempts]
    out = subprocess.run(
        [sys.executable, "-c", SECOND, *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


def _tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def test_a_second_job_on_either_directory_is_refused_until_the_first_closes(
    tmp_path: Path,
) -> None:
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    first = subprocess.Popen(
        [sys.executable, "-c", FIRST, str(persistent), str(local)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "saved"
        before = (_tree(persistent), _tree(local))
        got = _second(
            (persistent, local, "tiered"),  # the same two: rank 0's local subtree refused first
            (persistent, tmp_path / "local2", "tiered"),  # the same persistent directory
            (tmp_path / "persistent2", local, "tiered"),  # the same local directory
            (persistent, local, "plain"),  # a CheckpointManager shares the lock
        )
        assert len(got) == 4 and all(g.startswith("refused") for g in got), got
        subtree = f"{local}{os.sep}rank-00000:"
        assert subtree in got[0] and "TieredCheckpointManager" in got[0], got
        assert f"{persistent}:" in got[1] and subtree in got[2] and f"{persistent}:" in got[3]
        assert (_tree(persistent), _tree(local)) == before  # the refused wrote nothing
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "closed"
        # closed (the process still alive): the second job starts and restores step 2
        assert _second((persistent, local, "tiered")) == [f"restored 2 {STEP_2}"]
    finally:
        if first.stdin is not None:
            first.stdin.close()
        first.wait(timeout=60)


def test_managers_of_one_process_share_the_directories(tmp_path: Path) -> None:
    """A loop that builds a new manager to resume (or a plain manager beside the tiered one)
    in the same process is not a second job."""
    ck = sp.Checkpoint(w=sp.Variable(np.arange(4, dtype=np.float32)))
    kw = {"local_directory": str(tmp_path / "local"), "local_every": 1, "persistent_every": 1}
    a = sp.TieredCheckpointManager(ck, str(tmp_path / "p"), **kw)
    a.save(1)
    a.wait()
    b = sp.TieredCheckpointManager(ck, str(tmp_path / "p"), **kw)
    assert b.restore_or_initialize() == 1
    plain = sp.CheckpointManager(ck, str(tmp_path / "p"))
    for m in (a, b):
        m.close()
    plain.close()


def test_an_exited_job_leaves_no_lock(tmp_path: Path) -> None:
    persistent, local = tmp_path / "persistent", tmp_path / "local"
    code = FIRST.replace("sys.stdin.readline()\nm.close()", "")  # exits holding the manager
    subprocess.run(
        [sys.executable, "-c", code, str(persistent), str(local)],
        input="\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert _second((persistent, local, "tiered")) == [f"restored 2 {STEP_2}"]
