"""CheckpointManager(delta=True, full_every=K) (docs/DELTA.md): saves are deltas against the
previous checkpoint with a full one every K, retention never deletes a base a kept checkpoint
needs, and a SIGKILL mid-save leaves the kept checkpoints readable and the next save working."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.manager import CheckpointManager
from shardpoint.objgraph.variables import Variable


def weights(step: int) -> np.ndarray:
    """The weights after ``step`` steps: one row of 64 moves per step (a delta-friendly change)."""
    w = (np.arange(256 * 64, dtype=np.float32).reshape(256, 64) % 97) * 0.25
    for s in range(1, step + 1):
        w[s % 256] += np.float32(s)
    return w


def depth(path: str) -> int:
    with sp.open(path) as r:
        return int(getattr(r, "delta_depth", 0))


def test_delta_manager_chains_and_retention(tmp_path: os.PathLike[str]) -> None:
    v = Variable(weights(0))
    mgr = CheckpointManager(Checkpoint(v=v), tmp_path, max_to_keep=2, delta=True, full_every=3)
    for step in range(1, 8):
        v.assign(weights(step))
        mgr.save()
        # every listed checkpoint and everything it needs is on disk and reads back bitwise
        for p in mgr.checkpoints:
            for b in spd.needed_bases(p):
                assert os.path.exists(b + ".index"), (step, p, b)
            n = int(p.rsplit("-", 1)[1])
            with sp.open(p) as r:
                key = next(k for k in r.keys() if k.startswith("v/"))
                assert r[key].tobytes() == weights(n).tobytes()
    # saves 1, 4, 7 are full (full_every=3); the others are chained deltas
    names = [os.path.basename(p) for p in mgr.checkpoints]
    assert [depth(os.path.join(tmp_path, f"ckpt-{n}")) for n in (4, 5, 6)] == [0, 1, 2]
    assert depth(mgr.latest_checkpoint) == 0
    # ckpt-6 needs 5 and 4; after the full save 7, max_to_keep=2 keeps 6 and 7, so 5 and 4
    # stay (needed by 6), 1..3 are gone
    assert names == ["ckpt-4", "ckpt-5", "ckpt-6", "ckpt-7"]
    assert not os.path.exists(os.path.join(tmp_path, "ckpt-3.index"))
    v.assign(weights(8))
    mgr.save()  # 8 is a delta on 7: 4, 5 and 6 are needed by nobody kept any more
    assert [os.path.basename(p) for p in mgr.checkpoints] == ["ckpt-7", "ckpt-8"]
    for n in (4, 5, 6):
        assert not os.path.exists(os.path.join(tmp_path, f"ckpt-{n}.index"))
    restored = Variable(np.zeros((256, 64), np.float32))
    Checkpoint(v=restored).restore(mgr.latest_checkpoint)
    assert restored.numpy().tobytes() == weights(8).tobytes()


def test_delta_manager_options_are_checked(tmp_path: os.PathLike[str]) -> None:
    ck = Checkpoint(v=Variable(weights(0)))
    with pytest.raises(ValueError, match="full_every"):
        CheckpointManager(ck, tmp_path / "a", delta=True, full_every=0)
    with pytest.raises(ValueError, match="incremental"):
        CheckpointManager(ck, tmp_path / "b", delta=True, incremental=True)
    mgr = CheckpointManager(ck, tmp_path / "c", delta=True)
    mgr.save()
    with pytest.raises(ValueError, match="blocking"):
        mgr.save(blocking=False)


CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path[:0] = [sys.argv[2]]
    from test_delta_manager import weights
    from shardpoint.objgraph.checkpoint import Checkpoint
    from shardpoint.objgraph.manager import CheckpointManager
    from shardpoint.objgraph.variables import Variable

    v = Variable(weights(0))
    mgr = CheckpointManager(Checkpoint(v=v), sys.argv[1], max_to_keep=2, delta=True,
                            full_every=3)
    for step in range(1, 1000):
        v.assign(weights(step))
        print("BEGIN", step, flush=True)
        mgr.save()
        print("DONE", step, flush=True)
    """
)


@pytest.mark.parametrize("kill_after", ["BEGIN 5", "BEGIN 6", "DONE 6"])
def test_kill_mid_save_keeps_chain_readable(tmp_path: os.PathLike[str], kill_after: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), os.path.dirname(__file__)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip() == kill_after:
                os.kill(child.pid, signal.SIGKILL)  # mid-save (BEGIN) or between saves
                break
        else:
            pytest.fail(f"child ended before {kill_after!r}")
    finally:
        child.kill()
        child.wait()
    ck = Checkpoint(v=Variable(np.zeros((256, 64), np.float32)))
    mgr = CheckpointManager(ck, tmp_path, max_to_keep=2, delta=True, full_every=3)
    assert mgr.checkpoints, "the kill lost every checkpoint"
    for p in mgr.checkpoints:  # every kept checkpoint (and its chain) reads back bitwise
        n = int(p.rsplit("-", 1)[1])
        restored = Variable(np.zeros((256, 64), np.float32))
        Checkpoint(v=restored).restore(p)
        assert restored.numpy().tobytes() == weights(n).tobytes()
    mgr.restore_or_initialize()
    n = int(mgr.latest_checkpoint.rsplit("-", 1)[1])
    ck.v.assign(weights(n + 1))
    path = mgr.save()  # the next save works (a delta on the latest kept, or full)
    got = Variable(np.zeros((256, 64), np.float32))
    Checkpoint(v=got).restore(path)
    assert got.numpy().tobytes() == weights(n + 1).tobytes()
