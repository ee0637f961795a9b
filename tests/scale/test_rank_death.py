"""A rank that dies mid-save (issue 42, part 4; docs/SCALE.md): 4 real rank processes save
numbered checkpoints with ``sp.Writer(rank=, world_size=)``, rank 0 commits (``sp.merge``, then
the state file), and one process is SIGKILLed at every phase of a save, into a local directory
and into a real S3 server (moto):

- a rank: before its data, mid-data (``shard.item``: one value written), during its commit
  (``writer.published``: shards published, partial index not), after its partial index;
- the coordinator: partials read and merged, nothing committed (``merge.read``), and after
  its commit but before cleanup and the state file (``commit.done``).

After every kill: the checkpoint is never complete (no index; a merge attempted without the
dead rank fails), ``sp.latest_checkpoint`` and a ``CheckpointManager`` still name the previous
one, whose files are bit-for-bit unchanged, ``gc`` removes the leftovers (and nothing else),
and the next save succeeds. Kill points inside the library are armed by
``SHARDPOINT_TEST_KILL_AT`` (rust/src/fault.rs)."""

from __future__ import annotations

import hashlib
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

import shardpoint as sp
from scale_rank_worker import RANKS, prefix_of, values
from shardpoint.errors import NotFoundError

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: (victim rank, Python-level kill word or "", library kill point or "")
RANK_KILLS = {
    "before_data": (2, "before_data", ""),
    "mid_data": (2, "", "shard.item:2"),
    "during_commit": (2, "", "writer.published"),
    "after_partial": (2, "after_partial", ""),
}
COORDINATOR_KILLS = {"merge_read": "merge.read", "after_commit": "commit.done"}
TIMEOUT = 60.0


class Proc:
    """A rank process and the lines it printed (read by a thread, so waits can time out)."""

    def __init__(self, rank: int, directory: str, kill_at: str = "") -> None:
        env = {**os.environ, "SHARDPOINT_TEST_KILL_AT": kill_at}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "scale_rank_worker", str(rank), directory],
            cwd=TESTS,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("READY")

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def expect(self, word: str) -> None:
        got = self.lines.get(timeout=TIMEOUT)
        if got is None or not got.startswith(word):
            self.p.kill()
            err = self.p.stderr.read() if self.p.stderr else ""
            raise AssertionError(f"expected {word!r}, got {got!r}; stderr: {err[-2000:]}")

    def killed(self) -> None:
        """Wait for this process to die of SIGKILL."""
        assert self.p.wait(timeout=TIMEOUT) == -9, self.p.returncode

    def close(self) -> None:
        if self.p.poll() is None:
            assert self.p.stdin is not None
            self.p.stdin.close()
            self.p.wait(timeout=TIMEOUT)


class Store:
    """The directory the ranks save into, and a bit-exact view of its files."""

    def __init__(self, directory: str, files: Callable[[], dict[str, str]]) -> None:
        self.directory = directory
        self.files = files

    def of(self, step: int) -> dict[str, str]:
        """The files of checkpoint ``step`` and their digests."""
        head = f"ckpt-{step}."
        return {k: v for k, v in self.files().items() if k.startswith(head)}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    if request.param == "local":

        def local_files() -> dict[str, str]:
            return {
                n: _sha((tmp_path / n).read_bytes())
                for n in os.listdir(tmp_path)
                if not n.endswith(".lock")  # commit locks: created by any commit, empty
            }

        yield Store(str(tmp_path), local_files)
        return
    pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
    from s3_server import moto_environment

    with moto_environment() as moto:
        bucket = moto.bucket()

        def s3_files() -> dict[str, str]:
            return {
                k.removeprefix("run/"): _sha(
                    moto.s3.get_object(Bucket=bucket, Key=k)["Body"].read()
                )
                for k in moto.keys(bucket)
            }

        yield Store(f"s3://{bucket}/run", s3_files)


def _check_values(prefix: str, step: int) -> None:
    got = sp.load_file(prefix)
    want = {k: v for r in range(RANKS) for k, v in values(step, r).items()}
    assert got.keys() == want.keys(), prefix
    for k, v in want.items():
        assert got[k].tobytes() == v.tobytes(), (prefix, k)


def _latest(directory: str) -> tuple[str | None, str | None]:
    m = sp.CheckpointManager(sp.Checkpoint(), directory)
    try:
        return sp.latest_checkpoint(directory), m.latest_checkpoint
    finally:
        m.close()


def test_rank_or_coordinator_killed_at_every_phase(store: Store) -> None:
    d = store.directory
    ranks = [Proc(r, d) for r in range(RANKS)]
    step = 1
    visible_after_rank_death = 0

    def save(step: int, victim: Proc | None = None, rank: int = -1, word: str = "") -> None:
        for r, p in enumerate(ranks):
            if r == rank:
                assert victim is not None
                victim.send(f"save {step} {word}".strip())
            else:
                p.send(f"save {step}")
        for r, p in enumerate(ranks):
            if r != rank:
                p.expect("PUBLISHED")

    try:
        save(step)
        ranks[0].send(f"merge {step}")
        ranks[0].expect("COMMITTED")
        kills = [(name, *v) for name, v in RANK_KILLS.items()]
        kills += [(name, 0, "", point) for name, point in COORDINATOR_KILLS.items()]
        for name, rank, word, point in kills:
            prev, new = prefix_of(d, step), prefix_of(d, step + 1)
            before = store.files()
            prev_files = store.of(step)
            victim = Proc(rank, d, kill_at=point)
            save(step + 1, victim, rank, word)
            if rank == 0:  # the coordinator: every partial is there; it dies committing
                victim.expect("PUBLISHED")
                victim.send(f"merge {step + 1}")
            victim.killed()
            if name == "after_commit":
                # the index was committed before the kill: complete and correct, only the
                # state file and the cleanup are missing
                _check_values(new, step + 1)
            else:
                visible_after_rank_death += sp.storage.exists(new)
                assert not sp.storage.exists(new), name
                with pytest.raises(NotFoundError):
                    sp.open(new)
                if name not in ("after_partial", "merge_read"):
                    # even a coordinator that merged without hearing from every rank
                    with pytest.raises(NotFoundError):
                        sp.merge(new, RANKS, token=str(step + 1))
            assert _latest(d) == (prev, prev), name
            assert store.of(step) == prev_files, f"{name}: the previous checkpoint changed"
            _check_values(prev, step)
            left = set(store.files()) - set(before)
            removed = sp.storage.gc(d, older_than=0)
            assert removed >= 1 if name == "after_commit" else removed == len(left), (name, left)
            after = store.files()
            if name == "after_commit":
                assert set(after) - set(before) == set(store.of(step + 1)), name
                assert not any(".index.part-" in k for k in after), after
            else:
                assert after == before, f"{name}: gc left {set(after) - set(before)}"
            step += 1
            # the next save succeeds (the regular process of the victim's rank takes over)
            save(step + 1)
            ranks[0].send(f"merge {step + 1}")
            ranks[0].expect("COMMITTED")
            step += 1
            _check_values(prefix_of(d, step), step)
            assert _latest(d) == (prefix_of(d, step),) * 2, name
        assert visible_after_rank_death == 0
        print(f"\n{d}: {len(kills)} kill points, 0 checkpoints visible after a rank died")
    finally:
        for p in ranks:
            p.close()
