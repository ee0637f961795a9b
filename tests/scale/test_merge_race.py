"""Two coordinators merging one prefix at once from partials in memory (FORMAT.md §8.4): real
processes released together, at a local prefix and on a moto S3 server. Exactly one commit
stands (or they serialize into the same checkpoint), the committed index is complete and reads
bit-exact in a fresh process, a loser gets an error naming the prefix, and ``gc`` finds nothing
left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shardpoint as sp

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")

from s3_server import moto_environment  # noqa: E402

WORLD = 2
# Each coordinator: say it is ready, wait for the go file, merge the partials it was handed.
COORDINATOR = """
import os, sys, time
import shardpoint as sp
prefix, world, token, parts_dir, go, hashed = sys.argv[1:7]
parts = [open(os.path.join(parts_dir, f"{r}"), "rb").read() for r in range(int(world))]
open(os.path.join(parts_dir, f"ready-{os.getpid()}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
try:
    sp.merge(prefix, int(world), token=token, partials=parts, durable=False,
             hashed_prefixes=hashed == "1")
    print("committed")
except sp.CheckpointError as e:
    print("refused", type(e).__name__, e)
"""


def _save_partials(prefix: str, token: str, fill: float, hashed: bool) -> list[bytes]:
    """One multi-writer save's ranks at ``prefix`` (rank r writes ``w{r}``), published."""
    out = []
    for r in range(WORLD):
        w = sp.Writer(
            prefix, rank=r, world_size=WORLD, merge_token=token, durable=False,
            hashed_prefixes=hashed,
        )  # fmt: skip
        w.add(f"w{r}", np.full(64, fill + r, dtype=np.float32))
        out.append(w.commit_partial())
    return out


def _setup(prefix: str, jobs: str, hashed: bool) -> list[tuple[str, list[bytes]]]:
    """A committed checkpoint at ``prefix``, then the coordinators' jobs: "one save" hands
    both coordinators the same save's partials; "two saves" gives the second a second job's
    save at the same prefix (its ranks' partials take the first's names)."""
    sp.save_file({"previous": np.arange(4.0)}, prefix)
    a = _save_partials(prefix, "a" * 32, 1.0, hashed)
    race = [("a" * 32, a), ("a" * 32, a)]
    if jobs == "two saves":
        race[1] = ("b" * 32, _save_partials(prefix, "b" * 32, 10.0, hashed))
    return race


def _race(
    tmp_path: Path, prefix: str, jobs: list[tuple[str, list[bytes]]], hashed: bool
) -> list[str]:
    """Start one coordinator process per job, release them together; their answers."""
    go = tmp_path / "go"
    procs = []
    for i, (token, parts) in enumerate(jobs):
        d = tmp_path / f"coord{i}"
        d.mkdir()
        for r, b in enumerate(parts):
            (d / str(r)).write_bytes(b)
        cmd = [sys.executable, "-c", COORDINATOR, prefix, str(WORLD), token, str(d), str(go)]
        procs.append((d, subprocess.Popen([*cmd, "1" if hashed else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))  # fmt: skip
    deadline = time.monotonic() + 60
    while not all(list(d.glob("ready-*")) for d, _ in procs):
        assert time.monotonic() < deadline, "coordinators did not start"
        time.sleep(0.01)
    go.touch()
    answers = []
    for _, p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-2000:]
        answers.append(out.strip())
    return answers


READ_BACK = """
import sys, shardpoint as sp
with sp.open(sys.argv[1]) as r:
    r.verify()
    print(sorted(r), [float(r[k][0]) for k in sorted(r)])
"""


def _read_back(prefix: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", READ_BACK, prefix], capture_output=True, text=True, check=True
    ).stdout.strip()


def _check_answers(answers: list[str], prefix_name: str, *, both_may_commit: bool) -> None:
    committed = [a for a in answers if a == "committed"]
    refused = [a for a in answers if a.startswith("refused")]
    assert len(committed) + len(refused) == 2, answers
    assert committed, answers  # one of them always commits
    if not both_may_commit:
        assert len(committed) == 1, answers
    for a in refused:
        assert prefix_name in a and "CheckpointIOError" in a, a


@pytest.mark.parametrize("hashed", [False, True], ids=["flat", "hashed"])
@pytest.mark.parametrize("jobs", ["one save", "two saves"])
def test_local_coordinators_race(tmp_path: Path, hashed: bool, jobs: str) -> None:
    ck = tmp_path / "ckpts"
    ck.mkdir()
    prefix = str(ck / "run")
    answers = _race(tmp_path, prefix, _setup(prefix, jobs, hashed), hashed)
    _check_answers(answers, str(ck / "run.index"), both_may_commit=False)
    # the first to take the commit lock wins; the other finds its save ended (one save: its
    # partials consumed; two saves: its shards removed by the winner's cleanup)
    first = 10.0 if jobs == "two saves" and answers[1] == "committed" else 1.0
    assert _read_back(prefix) == f"['w0', 'w1'] [{first}, {first + 1}]"
    assert sp.storage.gc(str(ck), older_than=0) == 0  # neither coordinator left anything behind
    files = sorted(
        str(p.relative_to(ck)) for p in ck.rglob("*") if p.is_file() and p.name != "run.lock"
    )
    assert len(files) == 1 + WORLD and files.count("run.index") == 1, files


@pytest.mark.parametrize("hashed", [False, True], ids=["flat", "hashed"])
@pytest.mark.parametrize("jobs", ["one save", "two saves"])
def test_s3_coordinators_race(tmp_path: Path, hashed: bool, jobs: str) -> None:
    with moto_environment() as moto:
        bucket = moto.bucket()
        prefix = f"s3://{bucket}/ckpts/run"
        answers = _race(tmp_path, prefix, _setup(prefix, jobs, hashed), hashed)
        # one save: a second coordinator after the first commits the same index again
        # (conditionally on the first's); two saves: the later commit stands, or one refused
        _check_answers(answers, f"{prefix}.index", both_may_commit=True)
        got = _read_back(prefix)
        assert got in ("['w0', 'w1'] [1.0, 2.0]", "['w0', 'w1'] [10.0, 11.0]"), got
        if jobs == "one save":
            assert got == "['w0', 'w1'] [1.0, 2.0]"
        assert sp.storage.gc(f"s3://{bucket}/ckpts", older_than=0) == 0
        keys = moto.keys(bucket)
        assert len(keys) == 1 + WORLD and keys.count("ckpts/run.index") == 1, keys
