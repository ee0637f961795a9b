"""Hostile checkpoints (issue 7, part 4): crafted files whose every crc is right but whose fields
lie (absurd counts, offsets past the end, overflowing shapes, decompression bombs, bad keys,
shard names escaping the directory, absurdly nested JSON). Each must be refused with the right
exception class and a message naming the file or key, in bounded time and memory, and never
crash the process. The cases live in ``reliability_helpers/hostile_cases.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import shardpoint as sp
from reliability_helpers import craft
from reliability_helpers.hostile_cases import CASES, base_entries, case, outcome

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
#: Cases that can take the whole process down when they fail; run only in a child process.
CHILD_ONLY = {"huge_declared_size"}
#: Peak RSS growth allowed over a child's baseline while it runs every case (KiB). The crafted
#: files are < 1 MiB; what they declare goes up to 1 TiB.
RSS_BUDGET_KB = 96 * 1024
#: Wall-clock bound per case (generous for a loaded CI machine; they take milliseconds).
CASE_SECONDS = 5.0


def test_crafted_base_checkpoint_is_valid(tmp_path) -> None:
    """The writer of the hostile cases makes valid files when told nothing hostile, so every
    refusal below is due to the one defect each case plants."""
    p = str(tmp_path / "ck")
    craft.write_checkpoint(p, base_entries(), chunk_bytes=4096)
    vals = sp.load_file(p)
    assert vals["c"] == "hello"
    assert vals["a"].shape == (3000,) and float(vals["a"][2999]) == 2999.0
    assert vals["b"].shape == (30, 100) and float(vals["b"].reshape(-1)[8]) == 1.0
    with sp.open(p) as r:
        r.verify()
        assert r.info("b").codec == "zstd" and r.info("b").chunks == 3
    import reference_reader as rr

    assert rr.load(p)[0]["c"] == "hello"


@pytest.mark.parametrize("name", sorted(set(CASES) - CHILD_ONLY))
def test_hostile_case_is_refused(tmp_path, name: str) -> None:
    build, expected, stage = case(name)
    prefix = build(str(tmp_path))
    t = time.perf_counter()
    cls, msg = outcome(prefix, verify=stage == "verify")
    elapsed = time.perf_counter() - t
    assert cls in expected, f"{name}: expected {expected}, got {cls}: {msg}"
    assert elapsed < CASE_SECONDS, f"{name}: took {elapsed:.2f}s"
    # The message names where: the index or shard file, or (for value decoding) the key.
    assert str(tmp_path) in msg or "key " in msg, f"{name}: message names no file/key: {msg}"
    cls_obj = getattr(sp.errors, cls, None)
    if cls_obj is not None:
        assert issubclass(cls_obj, sp.CheckpointError)


def _run_cases_in_child(names: list[str]) -> tuple[dict[str, dict], dict[str, int], int]:
    """Run ``names`` in child processes (one after another in the same child; a new child
    after one dies). Returns per-case results, per-case return codes of dead children, and
    the baseline RSS (KiB) of a child after imports."""
    results: dict[str, dict] = {}
    deaths: dict[str, int] = {}
    baseline = 0
    todo = list(names)
    while todo:
        proc = subprocess.run(
            [sys.executable, "-m", "reliability_helpers.hostile_cases", *todo],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=300,
        )
        started = None
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            if rec.get("case") is None and "start" not in rec:
                baseline = max(baseline, rec["maxrss_kb"])
            elif "start" in rec:
                started = rec["start"]
            else:
                results[rec["case"]] = rec
                started = None
        if proc.returncode == 0:
            break
        assert started is not None, f"child failed outside a case: {proc.stderr[-2000:]}"
        deaths[started] = proc.returncode
        todo = todo[todo.index(started) + 1 :]
    return results, deaths, baseline


def test_hostile_cases_bounded_memory_and_no_crash() -> None:
    """Every case, in a child process: none kills the process (abort, segfault, OOM kill),
    each is refused with its expected class, and the child's peak RSS stays within a small
    budget over its baseline although the files declare up to 1 TiB of data."""
    names = sorted(CASES)
    results, deaths, baseline = _run_cases_in_child(names)
    problems = [f"{n}: child died with return code {rc}" for n, rc in deaths.items()]
    for n in names:
        if n in deaths:
            continue
        rec = results[n]
        _, expected, _ = case(n)
        if rec["cls"] not in expected:
            problems.append(f"{n}: expected {expected}, got {rec['cls']}: {rec['msg']}")
        if rec["maxrss_kb"] - baseline > RSS_BUDGET_KB:
            problems.append(f"{n}: peak RSS {rec['maxrss_kb'] - baseline} KiB over baseline")
        if rec["s"] > CASE_SECONDS:
            problems.append(f"{n}: took {rec['s']:.2f}s")
    assert not problems, "\n".join(problems)
