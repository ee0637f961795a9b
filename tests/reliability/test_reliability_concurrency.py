"""Concurrency (issue 7, part 3): readers in threads and in another process repeatedly open and
read the latest checkpoint while a writer process saves and its manager deletes old ones. No
reader may ever see mixed or partial data (every checkpoint's values are all its step) or an
error other than "that checkpoint was deleted since you looked it up". An open reader keeps
reading a checkpoint the manager deleted: its mappings hold the files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np

import shardpoint as sp
from reliability_helpers.crash_child import make_checkpoint, state_for, step_of

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SAVES = int(os.environ.get("SHARDPOINT_CONCURRENCY_SAVES", "60"))

_READER_PROCESS = """
import os, sys, time
sys.path.insert(0, {here!r})
import shardpoint as sp
from reliability_helpers.crash_child import step_of
d, stop = sys.argv[1], sys.argv[2]
reads = gone = 0
while not os.path.exists(stop):
    latest = sp.latest_checkpoint(d)
    if latest is None:
        continue
    try:
        with sp.open(latest) as r:
            vals = r.load()
    except sp.NotFoundError:
        gone += 1  # deleted by the manager between latest_checkpoint and open
        continue
    s = step_of(vals)
    assert s is not None and latest.endswith(f"-{{s}}"), (latest, s)
    reads += 1
print(reads, gone)
"""


def _reader_thread(d: str, stop: threading.Event, stats: Counter[str], errors: list[str]) -> None:
    while not stop.is_set():
        latest = sp.latest_checkpoint(d)
        if latest is None:
            continue
        try:
            with sp.open(latest) as r:
                vals = r.load()
                s = step_of(vals)
                if stats["reads"] % 10 == 0:
                    r.verify()
        except sp.NotFoundError:
            stats["gone"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - every other error is a failure
            errors.append(f"{latest}: {type(e).__name__}: {e}")
            continue
        if s is None or not latest.endswith(f"-{s}"):
            errors.append(f"{latest}: mixed or partial values (step {s})")
        stats["reads"] += 1


def test_readers_during_saves_and_deletions(tmp_path) -> None:
    d = str(tmp_path)
    stop_file = str(tmp_path / "STOP")
    # one save first, so readers have something from the start
    subprocess.run(
        [sys.executable, "-m", "reliability_helpers.crash_child", "manager", d, "1"],
        cwd=HERE,
        check=True,
        capture_output=True,
    )
    reader_proc = subprocess.Popen(
        [sys.executable, "-c", _READER_PROCESS.format(here=HERE), d, stop_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stop = threading.Event()
    stats: Counter[str] = Counter()
    errors: list[str] = []
    threads = [
        threading.Thread(target=_reader_thread, args=(d, stop, stats, errors)) for _ in range(3)
    ]
    for t in threads:
        t.start()
    try:
        writer = subprocess.run(
            [sys.executable, "-m", "reliability_helpers.crash_child", "manager", d, str(SAVES)],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert writer.returncode == 0, writer.stderr[-3000:]
    finally:
        stop.set()
        open(stop_file, "w").close()
        for t in threads:
            t.join()
        out, err = reader_proc.communicate(timeout=60)
    assert reader_proc.returncode == 0, err[-3000:]
    proc_reads, proc_gone = map(int, out.split())
    assert not errors, errors[:5]
    # the readers really overlapped the saves
    assert stats["reads"] >= 20 and proc_reads >= 10, (stats, proc_reads)
    print(f"\nconcurrency: threads {dict(stats)}, process reads {proc_reads} gone {proc_gone}")
    assert sp.latest_checkpoint(d).endswith(f"-{SAVES + 1}")


def test_open_reader_survives_deletion(tmp_path) -> None:
    """A reader opened on ckpt-1 keeps returning ckpt-1's values (zero-copy, decoded and
    verified) after the manager has deleted every file of ckpt-1."""
    ck = make_checkpoint()
    mgr = sp.CheckpointManager(ck, str(tmp_path), max_to_keep=2)
    ck.w.assign(state_for(1)["w"])
    ck.b.assign(state_for(1)["b"])
    first = mgr.save()
    reader = sp.open(first)
    zero_copy = reader.load(["b/.ATTRIBUTES/VARIABLE_VALUE"])["b/.ATTRIBUTES/VARIABLE_VALUE"]
    for step in range(2, 6):
        ck.w.assign(state_for(step)["w"])
        ck.b.assign(state_for(step)["b"])
        mgr.save()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(os.path.basename(first) + ".")]
    assert step_of(reader.load()) == 1
    reader.verify()
    assert np.array_equal(zero_copy, np.full(16, 1))
    assert reader.info("w/.ATTRIBUTES/VARIABLE_VALUE").codec != "none"  # decoded from the map
    reader.close()
    assert np.array_equal(zero_copy, np.full(16, 1))  # arrays outlive the reader


def test_readers_of_a_prefix_overwritten_in_place(tmp_path) -> None:
    """``save_file`` over the same prefix again and again (the commit protocol links new shards
    beside the old ones and cleans them up) while threads open and read it: a reader sees one
    whole save or the next, never a mix, and never a spurious error."""
    p = str(tmp_path / "ck")
    sp.save_file(state_for(0), p, durable=False)
    stop = threading.Event()
    seen: Counter[str] = Counter()
    errors: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                with sp.open(p) as r:
                    s = step_of(r.load())
            except Exception as e:  # noqa: BLE001 - no error is expected here at all
                errors.append(f"{type(e).__name__}: {e}")
                continue
            if s is None:
                errors.append("mixed or partial values")
            seen["reads"] += 1

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    try:
        for step in range(1, 200):
            sp.save_file(state_for(step), p, durable=False)
            if time.perf_counter() - t0 > 15:
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    print(f"\noverwrite in place: {dict(seen)}, errors {len(errors)}")
    assert seen["reads"] > 20
    assert not errors, f"{len(errors)} errors, first: {errors[:3]}"
