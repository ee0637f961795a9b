"""Two independent ``dcp.save`` runs with our ``StorageWriter`` at one prefix at the same time
(issue 42; FORMAT.md §8 and §8.4): two real processes, each a DCP save without a process group
(so each is its own coordinator: its ``write_data`` publishes rank 0's partial index, its
``finish`` writes the metadata writer's partial and merges from memory), released together,
round after round, at a flat and at a hashed prefix, the second job starting a little later
each round so the race lands in every phase of the first's save.

Every round: each save either commits or fails with ``CheckpointIOError`` naming ``P.index``
(a commit at ``P`` ended its save: FORMAT.md §8.4); at least one commits; what ``P`` holds, read
in a fresh process (``verify`` and ``dcp.load``), is bit for bit one job's whole state dict and,
when only one committed, that job's. A refused save's ranks' files go with the winner's cleanup;
what its own ``finish`` published before its merge was refused (the metadata writer's partial
and shard: a refused merge removes nothing) is left, and ``gc`` removes exactly that: then the
files at ``P`` are exactly its index and the shards it names."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import shardpoint as sp  # noqa: E402

ROUNDS = 8  # even rounds flat, odd rounds hashed
#: how much later than the first the second job starts, by round (milliseconds)
STAGGER_MS = (0, 0, 2, 2, 5, 5, 10, 10)

# Both jobs' state dicts, built the same way by the savers, the reader and this test.
STATE = """
import torch
def state(job, rnd):
    g = torch.Generator().manual_seed(1000 * job + rnd)
    return {
        "model.w": torch.randn(96, 40, generator=g),
        "model.b": torch.arange(40, dtype=torch.int64) + 7 * job + rnd,
        "opt.m": torch.randn(3, 5, 7, generator=g).to(torch.bfloat16),
        "step": 1000 * job + rnd,
    }
"""

SAVER = (
    STATE
    + """
import os, sys, time, warnings
import torch.distributed.checkpoint as dcp
import shardpoint as sp
from shardpoint.torch import StorageWriter
base, job, rounds, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
stagger = [int(x) for x in sys.argv[5].split(",")]
warnings.filterwarnings("ignore")  # dcp.save without a process group says so
for rnd in range(rounds):
    sd = state(job, rnd)
    writer = StorageWriter(os.path.join(base, f"r{rnd}", "run"), durable=False, threads=2,
                           hashed_prefixes=rnd % 2 == 1)
    open(os.path.join(sync, f"ready-{job}-{rnd}"), "w").close()
    while not os.path.exists(os.path.join(sync, f"go-{rnd}")):
        time.sleep(0.0002)
    if job == 1:
        time.sleep(stagger[rnd] / 1000)
    try:
        dcp.save(sd, storage_writer=writer)
        answer = "committed"
    except BaseException as e:
        # without a process group DCP raises its CheckpointException (a BaseException)
        # holding ours
        failures = getattr(e, "failures", None)
        inner = next(iter(failures.values())) if failures else e
        inner = inner[0] if isinstance(inner, tuple) else inner
        answer = f"refused {type(inner).__name__} {inner}"
    # published whole by a rename: the test reads an answer as soon as its name exists
    answer_path = os.path.join(sync, f"answer-{job}-{rnd}")
    with open(answer_path + ".tmp", "w") as f:
        f.write(answer.replace(chr(10), " "))
    os.replace(answer_path + ".tmp", answer_path)
"""
)

# Per round: the digest of every value dcp.load gives back (after verify), and the files the
# committed index names.
READER = (
    STATE
    + """
import hashlib, json, os, sys
import torch.distributed.checkpoint as dcp
import shardpoint as sp
from shardpoint.torch import StorageReader
base, rounds = sys.argv[1], int(sys.argv[2])
out = []
for rnd in range(rounds):
    prefix = os.path.join(base, f"r{rnd}", "run")
    with sp.open(prefix) as r:
        r.verify()
        shards = sorted(os.path.relpath(os.fspath(s), os.path.dirname(prefix))
                        for s, _ in r.format_info["shards"])
    target = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1)
              for k, v in state(0, rnd).items()}
    dcp.load(target, storage_reader=StorageReader(prefix))
    digests = {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
               if isinstance(v, torch.Tensor) else str(v) for k, v in target.items()}
    out.append({"digests": digests, "shards": shards})
print(json.dumps(out))
"""
)


def _digests(sd: dict[str, object]) -> dict[str, str]:
    return {
        k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        if isinstance(v, torch.Tensor)
        else str(v)
        for k, v in sd.items()
    }


def _wait_for(paths: list[Path], procs: list[subprocess.Popen[str]], what: str) -> None:
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in paths):
        for proc in procs:
            if proc.poll() is not None and proc.returncode != 0:
                raise AssertionError(f"a saver died ({what}): {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def test_two_dcp_saves_race_at_one_prefix(tmp_path: Path) -> None:
    base, sync = tmp_path / "ckpts", tmp_path / "sync"
    base.mkdir()
    sync.mkdir()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    stagger = ",".join(str(ms) for ms in STAGGER_MS)
    cmd = [sys.executable, "-c", SAVER, str(base)]
    procs = [
        subprocess.Popen(
            [*cmd, str(job), str(ROUNDS), str(sync), stagger],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for job in (0, 1)
    ]
    try:
        answers = []
        for rnd in range(ROUNDS):
            _wait_for([sync / f"ready-{job}-{rnd}" for job in (0, 1)], procs, f"round {rnd}")
            (sync / f"go-{rnd}").touch()
            done = [sync / f"answer-{job}-{rnd}" for job in (0, 1)]
            _wait_for(done, procs, f"the answers of round {rnd}")
            answers.append([p.read_text() for p in done])
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            proc.kill()

    namespace: dict[str, object] = {}
    exec(STATE, namespace)  # the same state dicts the savers built
    state = namespace["state"]
    read = subprocess.run(
        [sys.executable, "-c", READER, str(base), str(ROUNDS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    rounds = json.loads(read.stdout.strip().splitlines()[-1])

    for rnd, (pair, got) in enumerate(zip(answers, rounds, strict=True)):
        d = base / f"r{rnd}"
        committed = [job for job, a in enumerate(pair) if a == "committed"]
        assert committed, (rnd, pair)  # one of them always commits
        for a in pair:
            if a != "committed":  # the loser: our error naming the prefix's index
                assert a.startswith("refused CheckpointIOError") and f"{d}/run.index" in a, a
        candidates = {job: _digests(state(job, rnd)) for job in committed}  # type: ignore[operator]
        # bit for bit one job's whole state (never a mix), and the sole committer's if only one
        assert got["digests"] in candidates.values(), (rnd, pair)
        files = _files(d)
        leftover = sorted(set(files) - {"run.index", *got["shards"]})
        assert set(got["shards"]) <= set(files), (rnd, pair, files)
        if leftover:
            # only a refused coordinator's own files: its finish published the metadata
            # writer's partial and shard before its merge found the save ended, and a refused
            # merge removes nothing (FORMAT.md §8.4); the ranks' files went with the winner's
            # cleanup. Nothing of the winner's is among them.
            assert len(committed) == 1, (rnd, pair, leftover)
            assert len(leftover) == 2, (rnd, pair, leftover)
            assert sum(f.endswith("index.part-00001-of-00002") for f in leftover) == 1, leftover
            assert sum("data-00001-of-00002" in f for f in leftover) == 1, leftover
        # gc removes exactly those, and the checkpoint is all that is left
        assert sp.storage.gc(str(d), older_than=0) == len(leftover), (rnd, pair, leftover)
        assert _files(d) == sorted(["run.index", *got["shards"]]), (rnd, pair)


def _files(d: Path) -> list[str]:
    return sorted(
        str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != "run.lock"
    )
