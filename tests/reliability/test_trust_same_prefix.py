"""Issue 12 item 1/3: two processes saving to the same prefix at the same moment.

Two long-lived writer processes save round after round to one prefix, released together by a
go-file per round. After every round the invariant is checked: ``P`` opens, verifies and equals
the state one of the two writers saved (both returned success, so the last committer wins), and
no temp file, lock file or unreferenced shard is left behind. Before the per-prefix commit lock,
the loser's cleanup unlinked the winner's published-but-uncommitted shards in most rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np

import shardpoint as sp

ROUNDS = int(os.environ.get("SHARDPOINT_TRUST_ROUNDS", "24"))

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import shardpoint as sp
    d, me, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    p = os.path.join(d, "ck")
    for r in range(rounds):
        go = os.path.join(d, f"go-{r}")
        while not os.path.exists(go):
            time.sleep(0.0005)
        state = {
            f"t{i}": np.full(3000 + 500 * i, r * 10 + me, dtype=np.float32) for i in range(6)
        }
        state["who"] = f"{r}-{me}"
        try:
            sp.save_file(state, p, shards=3, compression="none" if r % 2 else "zstd")
            out = "ok"
        except sp.CheckpointError as e:  # a writer that cannot commit safely must say why
            out = "error " + type(e).__name__ + " " + str(e).replace(chr(10), " ")
        with open(os.path.join(d, f"done-{r}-{me}.tmp"), "w") as f:
            f.write(out)
        os.rename(os.path.join(d, f"done-{r}-{me}.tmp"), os.path.join(d, f"done-{r}-{me}"))
    """
)


def _wait(path: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    """The content of ``path`` once ``proc`` has written it."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None and not os.path.exists(path):
            raise AssertionError(f"writer exited with {proc.returncode}: {proc.stderr.read()!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.001)
    with open(path) as f:
        return f.read()


def test_same_prefix_concurrent_saves_never_lose_the_checkpoint(tmp_path):
    d = str(tmp_path)
    p = os.path.join(d, "ck")
    sp.save_file({"who": "before", "t0": np.zeros(10, np.float32)}, p)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, d, str(me), str(ROUNDS)],
            stderr=subprocess.PIPE,
        )
        for me in (1, 2)
    ]
    survived = 0
    try:
        for r in range(ROUNDS):
            open(os.path.join(d, f"go-{r}"), "w").close()
            outs = [_wait(os.path.join(d, f"done-{r}-{me}"), procs[me - 1]) for me in (1, 2)]
            assert outs == ["ok", "ok"], (r, outs)
            with sp.open(p) as rd:
                rd.verify()
                vals = rd.load()
                shard_names = {os.path.basename(f) for f, _ in rd.format_info["shards"]}
            who = vals["who"]
            assert who in (f"{r}-1", f"{r}-2"), (r, who)
            me = int(who.split("-")[1])
            for i in range(6):
                np.testing.assert_array_equal(
                    vals[f"t{i}"], np.full(3000 + 500 * i, r * 10 + me, np.float32)
                )
            # nothing of the losing save, no temp file and no lock file is left behind
            files = {f for f in os.listdir(d) if f.startswith("ck.")}
            assert files == {"ck.index"} | shard_names, (r, sorted(files))
            survived += 1
    except BaseException:
        for pr in procs:  # they would wait for go-files forever
            pr.kill()
        raise
    finally:
        for pr in procs:
            pr.wait(timeout=60)
    assert [pr.returncode for pr in procs] == [0, 0]
    assert survived == ROUNDS >= 20
