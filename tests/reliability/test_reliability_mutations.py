"""Issue 23 item 5: a bounded mutation campaign in the test suite.

Four small checkpoints (codecs none, zstd, zstd-bytegroup, bytegroup-huffman; two shards, 4 KiB
chunks; tensors, a str, an int and a JSON value) are damaged in five ways, each applied to a
seeded random place of the index or of a shard: one bit flipped, bytes overwritten with random
ones, the file truncated, garbage appended, a range zeroed. Every damaged copy is then read
through 13 read APIs (``r[k]``, ``get``, ``open(copy=True)[k]``, ``info``, ``load``,
``load(keys)``, ``load_into``, ``slice``, ``get_slice``, ``metadata``, ``verify``,
``load_file``, ``load_file(copy=True)``) in worker processes that limit their own address
space (``RLIMIT_AS``) and are timed out by the parent.

Each read must raise a ``CheckpointError`` or return exactly what the undamaged checkpoint
gives. The campaign fails on a wrong value, an exception outside shardpoint's error tree, a
worker killed by a signal (an abort on an unbounded allocation, a segfault) or a hang.
Workers are reused across mutations (two at a time, one per core) and replaced when one dies,
so the campaign costs a few worker starts, not one per read. ``SHARDPOINT_MUTATIONS`` sets the
mutation count (default 600).
"""

from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import shardpoint as sp

_HERE = os.path.dirname(os.path.abspath(__file__))
_WORKER = os.path.join(os.path.dirname(_HERE), "reliability_helpers", "mutation_worker.py")
CODECS = ("none", "zstd", "zstd-bytegroup", "bytegroup-huffman")
CLASSES = ("bitflip", "overwrite", "truncate", "append", "zero")
APIS = (
    "r[k]",
    "get",
    "open(copy)[k]",
    "info",
    "load",
    "load(keys)",
    "load_into",
    "slice",
    "get_slice",
    "metadata",
    "verify",
    "load_file",
    "load_file(copy)",
)
#: seconds one job (every API on one damaged copy) may take before the worker counts as hung
JOB_SECONDS = 60.0


def _values() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    return {
        "m": np.round(rng.standard_normal((24, 80)), 2).astype(np.float32),  # 7.5 KiB, 2 chunks
        "v": np.arange(3000, dtype=np.int32) % 97,
        "h": rng.standard_normal(500).astype(np.float16),
        "b": rng.integers(0, 2, 200).astype(bool),
        "s": "a string value",
        "n": 12345678901234567890,
        "j": {"lr": 0.1, "steps": [1, 2, 3]},
    }


def _mutate(rng: random.Random, path: str, cls: str) -> str:
    """Damage ``path`` in place; return what was done."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if cls == "truncate":
            n = rng.randrange(size)
            f.truncate(n)
            return f"truncated to {n}"
        if cls == "append":
            junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
            f.seek(size)
            f.write(junk)
            return f"appended {len(junk)} bytes"
        at = rng.randrange(size)
        f.seek(at)
        old = f.read(min(64, size - at))
        if cls == "bitflip":
            new = bytes([old[0] ^ (1 << rng.randrange(8))])
        elif cls == "overwrite":
            n = rng.randint(1, min(16, len(old)))
            new = bytes(rng.randrange(256) for _ in range(n))
        else:  # zero
            new = bytes(rng.randint(1, len(old)))
        f.seek(at)
        f.write(new)
        return f"{cls} {len(new)} bytes at {at}"


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    job: dict[str, Any] | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    started: float = 0.0
    buf: bytes = b""  # output read but not yet split into lines

    @property
    def fd(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def lines(self, data: bytes) -> list[dict[str, Any]]:
        """Complete JSON lines of what was read so far (raw reads: a buffered readline would
        hide lines from select())."""
        self.buf += data
        *complete, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in complete]

    def send(self, job: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        self.proc.stdin.flush()


class _Pool:
    """Worker processes reading jobs from stdin and answering one line per API."""

    def __init__(self, n: int, env: dict[str, str], job_seconds: float = JOB_SECONDS) -> None:
        self.env = env
        self.job_seconds = job_seconds
        self.sel = selectors.DefaultSelector()
        self.workers = [self._spawn() for _ in range(n)]
        self.starts = n

    def _spawn(self) -> _Worker:
        p = subprocess.Popen(
            [sys.executable, _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env
        )
        w = _Worker(p)
        got: list[dict[str, Any]] = []
        while not got:
            data = os.read(w.fd, 1 << 16)
            assert data, "a worker died while starting"
            got = w.lines(data)
        # the address-space limit is set: an unbounded allocation kills the worker, not the host
        assert 0 < got[0]["as_limit"] < 64 << 30, got
        self.sel.register(w.fd, selectors.EVENT_READ, w)
        return w

    def _replace(self, w: _Worker) -> None:
        self.sel.unregister(w.fd)
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()
        self.workers[self.workers.index(w)] = self._spawn()
        self.starts += 1

    def run(self, jobs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Every job, returning (job, one result per API); a worker that dies or hangs gives
        its unfinished API the outcome ``signal N`` or ``hang``."""
        todo = list(jobs)
        done: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

        def feed(w: _Worker) -> None:
            if todo and w.job is None:
                w.job, w.results, w.started = todo.pop(), [], time.monotonic()
                w.send(w.job)

        for w in self.workers:
            feed(w)
        while any(w.job is not None for w in self.workers):
            for key, _ in self.sel.select(timeout=1.0):
                w = key.data
                data = os.read(w.fd, 1 << 16)
                if not data:  # died
                    w.proc.wait()
                    self._fail(w, done, f"signal {-(w.proc.returncode or 0)}")
                    continue
                for msg in w.lines(data):
                    if msg.get("done"):
                        done.append((w.job, w.results))  # type: ignore[arg-type]
                        w.job = None
                        feed(w)
                    else:
                        w.results.append(msg)
            now = time.monotonic()
            for w in list(self.workers):
                if w.job is not None and now - w.started > self.job_seconds:
                    self._fail(w, done, "hang")
            for w in self.workers:
                feed(w)
        return done

    def _fail(self, w: _Worker, done: list[Any], outcome: str) -> None:
        job = w.job
        assert job is not None
        api = job["apis"][min(len(w.results), len(job["apis"]) - 1)]
        w.results.append({"api": api, "outcome": outcome, "detail": outcome})
        done.append((job, w.results))
        w.job = None
        self._replace(w)

    def close(self) -> None:
        for w in self.workers:
            assert w.proc.stdin is not None
            w.proc.stdin.close()
            w.proc.wait(timeout=30)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(sp.__file__)), env.get("PYTHONPATH", "")]
    )
    env["RAYON_NUM_THREADS"] = "2"
    return env


def test_the_pool_reports_deaths_hangs_and_wrong_values(tmp_path) -> None:
    """The campaign's own detection: a worker that aborts, one that allocates past its
    address-space limit, one that hangs, and a read of another checkpoint's values (wrong)
    are each reported, and the pool goes on with fresh workers."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sp.save_file({"m": np.zeros((10, 10), np.float32)}, a)
    sp.save_file({"m": np.ones((10, 10), np.float32)}, b)
    jobs = [
        {"prefix": a, "pristine": a, "apis": ["r[k]", "_abort", "get"]},
        {"prefix": a, "pristine": a, "apis": ["_allocate_past_limit"]},
        {"prefix": a, "pristine": a, "apis": ["_hang"]},
        {"prefix": b, "pristine": a, "apis": ["load", "slice"]},
    ]
    pool = _Pool(2, _env(), job_seconds=5.0)
    try:
        done = pool.run(jobs)
    finally:
        pool.close()
    got = {tuple(j["apis"]): [r["outcome"] for r in res] for j, res in done}
    assert got[("r[k]", "_abort", "get")] == ["equal", "signal 6"]
    died = got[("_allocate_past_limit",)][0]
    assert died.startswith("signal") or died == "unexpected", died  # MemoryError or abort
    assert got[("_hang",)] == ["hang"]
    assert got[("load", "slice")] == ["wrong", "wrong"]
    assert pool.starts >= 4  # two replaced (at least) after the abort and the hang


def test_mutation_campaign(tmp_path) -> None:
    count = int(os.environ.get("SHARDPOINT_MUTATIONS", "600"))
    rng = random.Random(23)
    pristine = {}
    for codec in CODECS:
        p = str(tmp_path / "pristine" / codec / "ck")
        os.makedirs(os.path.dirname(p))
        sp.save_file(
            _values(), p, compression=codec, shards=2, chunk_bytes=4096, metadata={"run": 7}
        )
        pristine[codec] = p
    jobs = []
    for i in range(count):
        codec, cls = CODECS[i % len(CODECS)], CLASSES[(i // len(CODECS)) % len(CLASSES)]
        src = pristine[codec]
        d = str(tmp_path / "m" / str(i))
        os.makedirs(d)
        names = sorted(os.listdir(os.path.dirname(src)))
        for name in names:
            shutil.copy(os.path.join(os.path.dirname(src), name), d)
        target = rng.choice(names)
        what = _mutate(rng, os.path.join(d, target), cls)
        jobs.append(
            {
                "prefix": os.path.join(d, "ck"),
                "pristine": src,
                "apis": list(APIS),
                "cls": cls,
                "codec": codec,
                "what": f"{target}: {what}",
            }
        )
    t = time.perf_counter()
    pool = _Pool(2, _env())
    try:
        done = pool.run(jobs)
    finally:
        pool.close()
    elapsed = time.perf_counter() - t
    assert len(done) == count
    tally: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
    bad = []
    for job, results in done:
        for res in results:
            tally[job["cls"]][res["outcome"].split()[0]] += 1
            if res["outcome"] not in ("equal", "error"):
                bad.append(f"{job['codec']} {job['what']} / {res['api']}: {res['detail']}")
    lines = [
        f"{cls:>9}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        for cls, c in tally.items()
    ]
    print(
        f"mutation campaign: {count} mutations x {len(APIS)} APIs in {elapsed:.1f} s, "
        f"{pool.starts} worker starts\n" + "\n".join(lines)
    )
    assert not bad, f"{len(bad)} failures:\n" + "\n".join(bad[:20])
    # the campaign must actually detect damage (not pass by reading nothing)
    assert sum(c["error"] for c in tally.values()) > count * len(APIS) // 3
