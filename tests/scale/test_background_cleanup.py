"""The merge's cleanup off the coordinator's critical path (FORMAT.md §8.3, docs/SCALE.md):
``sp.merge(wait_cleanup=False)`` (opt-in) at a local prefix returns once ``P.index`` is
committed and a thread holding the commit lock removes the replaced checkpoint's shards and the consumed partial indexes.

Each scenario runs in a fresh process (the cleanup's lifetime is the process's): the cleanup
is held back with ``SHARDPOINT_TEST_DELAY_AT=cleanup.background:<ms>`` (rust/src/fault.rs) so
that the test acts while it still holds the lock."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import shardpoint as sp

ROOT = Path(__file__).resolve().parents[2]
RANKS = 4

# One multi-writer save of `step` (RANKS ranks, one value each), then the merge.
SAVE = """
import os, sys, time, threading
import numpy as np
import shardpoint as sp
from shardpoint import _core

def save(prefix, step, **merge_kw):
    for r in range({ranks}):
        with sp.Writer(prefix, rank=r, world_size={ranks}, merge_token=f"s{{step}}") as w:
            w.add(f"r{{r}}", np.full(8, step * 10 + r, np.float32))
    merge_kw.setdefault("wait_cleanup", False)  # the opt-in background cleanup
    sp.merge(prefix, {ranks}, token=f"s{{step}}", **merge_kw)
"""


def _run(body: str, *, delay_ms: int | None = None, kill_at: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    env.pop("SHARDPOINT_TEST_DELAY_AT", None)
    env.pop("SHARDPOINT_TEST_KILL_AT", None)
    if delay_ms is not None:
        env["SHARDPOINT_TEST_DELAY_AT"] = f"cleanup.background:{delay_ms}"
    if kill_at is not None:
        env["SHARDPOINT_TEST_KILL_AT"] = kill_at
    code = SAVE.format(ranks=RANKS) + textwrap.dedent(body)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    if kill_at is None:
        assert out.returncode == 0, out.stderr
    return out.stdout


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def _check_values(prefix: Path, step: int) -> None:
    got = sp.load_file(prefix)
    want = {f"r{r}": np.full(8, step * 10 + r, np.float32) for r in range(RANKS)}
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)


def test_merge_returns_before_its_cleanup_and_the_next_save_waits(tmp_path: Path) -> None:
    """The merge returns while its cleanup still runs (the replaced save's files are still
    there, the new checkpoint already loads); the next save at the prefix waits for the
    cleanup (it holds the commit lock), and ``wait_for_cleanups`` leaves exactly the new
    checkpoint's files."""
    out = _run(
        f"""
        prefix = {str(tmp_path / "ck")!r}
        save(prefix, 1, wait_cleanup=True)
        first = sorted(os.listdir({str(tmp_path)!r}))
        t0 = time.perf_counter()
        save(prefix, 2)
        merged = time.perf_counter() - t0
        pending = _core.pending_cleanups()
        during = sorted(os.listdir({str(tmp_path)!r}))
        got = sp.load_file(prefix)
        assert float(got["r1"][0]) == 21.0, got
        # a single writer's commit at the same prefix must wait for the cleanup's lock
        t1 = time.perf_counter()
        sp.save_file({{"x": np.zeros(2)}}, prefix + "-other")
        other = time.perf_counter() - t1
        t2 = time.perf_counter()
        with sp.Writer(prefix) as w:
            w.add("solo", np.ones(3, np.float32))
        waited = time.perf_counter() - t2
        sp.wait_for_cleanups()
        print(len(first), len(during), pending, f"{{merged:.3f}} {{other:.3f}} {{waited:.3f}}")
        """,
        delay_ms=1500,
    )
    n_first, n_during, pending, merged, other, waited = out.split()
    # save 1: RANKS shards + the index; during save 2's cleanup: both saves' shards, save 2's
    # partials, the index and the lock file
    assert int(n_first) == RANKS + 1, out
    assert int(n_during) == 2 * RANKS + RANKS + 1 + 1, out
    assert int(pending) == 1, out
    assert float(merged) < 1.5, out  # the merge did not wait for its 1.5 s cleanup
    assert float(other) < 1.0, out  # another prefix's commit is not held up
    assert float(waited) > 0.5, out  # the same prefix's next commit waited for the lock
    assert sorted(sp.load_file(tmp_path / "ck")) == ["solo"]
    assert _files(tmp_path) == {
        "ck.index",
        "ck.data-00000-of-00001",
        "ck-other.index",
        "ck-other.data-00000-of-00001",
    }


def test_process_exit_finishes_the_cleanup(tmp_path: Path) -> None:
    """A process that merges and exits at once still removes what the merge replaced (the
    cleanup is joined at interpreter exit)."""
    prefix = tmp_path / "ck"
    _run(
        f"""
        save({str(prefix)!r}, 1)
        save({str(prefix)!r}, 2)
        """,
        delay_ms=300,
    )
    _check_values(prefix, 2)
    _only_the_checkpoint(tmp_path, RANKS)


def _only_the_checkpoint(d: Path, shards: int) -> None:
    """``d`` holds the checkpoint ``ck`` alone: its index and its shards (under their plain
    or tokened names: the second save's shards are tokened, the plain names were taken when
    it published), no partial index, no lock file, nothing of the replaced save."""
    rest = _files(d) - {"ck.index"}
    assert len(rest) == shards, rest
    for r in range(shards):
        plain = f"ck.data-{r:05d}-of-{shards:05d}"
        assert sum(f == plain or f.startswith(plain + ".") for f in rest) == 1, rest


def test_killed_during_cleanup_leaves_a_complete_checkpoint(tmp_path: Path) -> None:
    """A process killed while its background cleanup holds the lock: the new checkpoint is
    complete and loads, the leftovers are only files no index references, and the next
    save (whose locked cleanup removes every unreferenced file of the prefix) clears them."""
    prefix = tmp_path / "ck"
    _run(f"save({str(prefix)!r}, 1, wait_cleanup=True)")
    before = _files(tmp_path)
    _run(f"save({str(prefix)!r}, 2)", kill_at="cleanup.background")
    _check_values(prefix, 2)
    left = _files(tmp_path)
    assert before - {"ck.index"} <= left, "the replaced save's shards were not removed"
    assert any(".index.part-" in f for f in left), left  # the consumed partials too
    _run(f"save({str(prefix)!r}, 3)")
    _check_values(prefix, 3)
    new_shards = _files(tmp_path) - {"ck.index"}
    assert len(new_shards) == RANKS and not any(".part-" in f for f in new_shards), new_shards


def test_a_forked_child_does_not_keep_the_prefix_locked(tmp_path: Path) -> None:
    """A child forked while the cleanup holds the commit lock (a data-loader worker forked
    right after a save) inherits the lock's descriptor; the child's copy is closed at fork,
    so the parent's next save at the prefix proceeds once the cleanup is done, while the
    child is still alive."""
    out = _run(
        f"""
        prefix = {str(tmp_path / "ck")!r}
        save(prefix, 1, wait_cleanup=True)
        save(prefix, 2)
        assert _core.pending_cleanups() == 1
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)  # alive until the parent is done
            os._exit(0)
        os.close(r)
        done = threading.Event()
        def next_save():
            save(prefix, 3, wait_cleanup=True)
            done.set()
        t = threading.Thread(target=next_save, daemon=True)
        t.start()
        finished = done.wait(20)
        os.write(w, b"x")
        os.waitpid(pid, 0)
        t.join(20)
        print(finished)
        """,
        delay_ms=1000,
    )
    assert out.split() == ["True"], out
    _check_values(tmp_path / "ck", 3)
