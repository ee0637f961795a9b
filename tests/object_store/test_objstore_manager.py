"""CheckpointManager on object-store URLs (moto S3 server and memory://): rotation,
latest_checkpoint, restore_or_initialize with fallback, pending deletions kept in an object, and
a second manager on the same URL that loses the race (clear error, nothing committed lost)."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest

import shardpoint as sp
from shardpoint import storage
from shardpoint.errors import CheckpointIOError, InvalidArgumentError, NotFoundError
from shardpoint.objgraph import storage_io
from shardpoint.objgraph.errors import DirectoryInUseError
from shardpoint.objgraph.manager import PENDING_DELETIONS_FILENAME


def _ck(x: float) -> sp.Checkpoint:
    return sp.Checkpoint(v=sp.Variable(np.full(4, x, dtype=np.float32)))


def _value(ck: sp.Checkpoint) -> float:
    return float(np.asarray(ck.v.numpy())[0])


def _names(url: str) -> list[str]:
    return sorted(n for n in storage.list_url(url) if not n.endswith("/"))


@pytest.fixture(params=["s3", "memory"])
def url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty directory URL in a moto bucket or in the in-memory store."""
    if request.param == "memory":
        return f"memory://mgr-{uuid.uuid4().hex[:12]}/run"
    bucket = request.getfixturevalue("bucket")
    return f"s3://{bucket}/run"


def test_manager_rotates_in_a_bucket(url: str) -> None:
    ck = _ck(0.0)
    mgr = sp.CheckpointManager(ck, url, max_to_keep=2)
    for i in range(1, 5):
        ck.v.assign(np.full(4, float(i), dtype=np.float32))
        assert mgr.save() == f"{url}/ckpt-{i}"
    assert mgr.checkpoints == [f"{url}/ckpt-3", f"{url}/ckpt-4"]
    assert mgr.latest_checkpoint == f"{url}/ckpt-4"
    assert sp.latest_checkpoint(url) == f"{url}/ckpt-4"
    names = _names(url)
    # exactly two checkpoints' objects (index + shard each) and the state object are left
    assert "checkpoint" in names
    heads = {n.split(".", 1)[0] for n in names if n != "checkpoint"}
    assert heads == {"ckpt-3", "ckpt-4"}, names
    assert sum(n.endswith(".index") for n in names) == 2
    assert PENDING_DELETIONS_FILENAME not in names
    # a manager created later over the URL takes over the listed checkpoints and rotates them
    mgr2 = sp.CheckpointManager(_ck(9.0), url, max_to_keep=2)
    assert mgr2.checkpoints == [f"{url}/ckpt-3", f"{url}/ckpt-4"]
    assert mgr2.save(checkpoint_number=5) == f"{url}/ckpt-5"
    assert {n.split(".", 1)[0] for n in _names(url) if n != "checkpoint"} == {"ckpt-4", "ckpt-5"}


def test_asynchronous_saves_rotate_in_a_bucket(url: str) -> None:
    """blocking=False: the state update runs in the background while the next save's
    start-of-save check runs in the foreground; neither mistakes the other for a rival."""
    ck = _ck(0.0)
    mgr = sp.CheckpointManager(ck, url, max_to_keep=2)
    futures = []
    for i in range(1, 5):
        ck.v.assign(np.full(4, float(i), dtype=np.float32))
        futures.append(mgr.save(blocking=False))
    mgr.wait()
    assert [f.result() for f in futures] == [f"{url}/ckpt-{i}" for i in range(1, 5)]
    assert sp.latest_checkpoint(url) == f"{url}/ckpt-4"
    heads = {n.split(".", 1)[0] for n in _names(url) if n != "checkpoint"}
    assert heads == {"ckpt-3", "ckpt-4"}
    ck2 = _ck(0.0)
    assert sp.CheckpointManager(ck2, url).restore_or_initialize() == f"{url}/ckpt-4"
    assert _value(ck2) == 4.0


def test_restore_or_initialize_from_a_bucket(url: str, caplog: pytest.LogCaptureFixture) -> None:
    inits: list[int] = []
    fresh = sp.CheckpointManager(_ck(0.0), url, init_fn=lambda: inits.append(1))
    assert fresh.restore_or_initialize() is None
    assert inits == [1]

    ck = _ck(1.0)
    mgr = sp.CheckpointManager(ck, url, max_to_keep=3)
    mgr.save()
    ck.v.assign(np.full(4, 2.0, dtype=np.float32))
    mgr.save()

    ck2 = _ck(0.0)
    mgr2 = sp.CheckpointManager(ck2, url, init_fn=lambda: inits.append(2))
    assert mgr2.restore_or_initialize() == f"{url}/ckpt-2"
    assert _value(ck2) == 2.0 and int(ck2.save_counter) == 2
    assert inits == [1]

    # the newest checkpoint damaged (a shard object gone): the previous one is restored, with
    # a warning naming the skipped one; strict=True raises instead
    shard = next(n for n in _names(url) if n.startswith("ckpt-2.data-"))
    storage.delete_object(f"{url}/{shard}")
    ck3 = _ck(0.0)
    mgr3 = sp.CheckpointManager(ck3, url)
    with caplog.at_level(logging.WARNING, logger="shardpoint"):
        assert mgr3.restore_or_initialize() == f"{url}/ckpt-1"
    assert _value(ck3) == 1.0
    assert f"{url}/ckpt-2" in caplog.text
    with pytest.raises(NotFoundError, match="ckpt-2.data-"):
        sp.CheckpointManager(_ck(0.0), url).restore_or_initialize(strict=True)


def test_restore_finds_unlisted_checkpoints_by_listing(url: str) -> None:
    """Candidates beyond the state object come from the store's listing: with the state
    object gone, the numbered checkpoints in the URL are still found, newest first."""
    ck = _ck(3.0)
    mgr = sp.CheckpointManager(ck, url)
    mgr.save()
    ck.v.assign(np.full(4, 4.0, dtype=np.float32))
    mgr.save()
    storage.delete_object(f"{url}/checkpoint")
    ck2 = _ck(0.0)
    assert sp.CheckpointManager(ck2, url).restore_or_initialize() == f"{url}/ckpt-2"
    assert _value(ck2) == 4.0


def test_failed_deletions_are_kept_in_an_object_and_retried(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = _ck(0.0)
    mgr = sp.CheckpointManager(ck, url, max_to_keep=1)
    mgr.save()
    real = storage_io.remove_checkpoint

    def refuse(prefix: str) -> None:
        raise CheckpointIOError(f"{prefix}: simulated throttle")

    monkeypatch.setattr(storage_io, "remove_checkpoint", refuse)
    mgr.save()  # ckpt-1 falls out of retention but cannot be deleted
    assert f"{url}/ckpt-1.index" in [f"{url}/{n}" for n in _names(url)]
    raw = storage_io.read_small(f"{url}/{PENDING_DELETIONS_FILENAME}")
    assert raw is not None and b"ckpt-1" in raw
    assert mgr.checkpoints == [f"{url}/ckpt-2"]
    monkeypatch.setattr(storage_io, "remove_checkpoint", real)
    # a new manager (a restarted job) reads the pending object and its first save retries
    mgr2 = sp.CheckpointManager(ck, url, max_to_keep=1)
    mgr2.save()
    names = _names(url)
    assert not any(n.startswith("ckpt-1.") for n in names), names
    assert PENDING_DELETIONS_FILENAME not in names


def test_second_manager_loses_before_writing(url: str) -> None:
    """Manager B created, then A saves: B's next save is refused before it writes anything,
    and A's committed checkpoints are all intact and still listed."""
    a_ck = _ck(1.0)
    a = sp.CheckpointManager(a_ck, url, max_to_keep=2)
    a.save()
    b = sp.CheckpointManager(_ck(7.0), url, max_to_keep=1)
    a_ck.v.assign(np.full(4, 2.0, dtype=np.float32))
    a.save()
    before = _names(url)
    with pytest.raises(DirectoryInUseError, match="changed by someone else"):
        b.save()  # would write ckpt-1 over A's and delete A's others
    assert _names(url) == before
    assert sp.latest_checkpoint(url) == f"{url}/ckpt-2"
    for n, want in ((1, 1.0), (2, 2.0)):
        ck = _ck(0.0)
        ck.restore(f"{url}/ckpt-{n}").assert_consumed()
        assert _value(ck) == want
    a_ck.v.assign(np.full(4, 3.0, dtype=np.float32))
    assert a.save() == f"{url}/ckpt-3"  # the winner goes on


class _RacingCheckpoint:
    """A duck-typed checkpoint for manager B whose write lets manager A commit a save in the
    middle of B's save (after B's start-of-save check passed): a true race."""

    def __init__(self, rival: sp.CheckpointManager) -> None:
        self.inner = _ck(7.0)
        self.save_counter = self.inner.save_counter
        self.rival = rival

    def write(self, path: str) -> str:
        self.rival.save()
        return self.inner.write(path)


def test_second_manager_loses_the_state_update_race(url: str) -> None:
    a_ck = _ck(1.0)
    a = sp.CheckpointManager(a_ck, url, max_to_keep=2)
    a.save()
    a_ck.v.assign(np.full(4, 2.0, dtype=np.float32))
    b = sp.CheckpointManager(_RacingCheckpoint(a), url, max_to_keep=1)
    with pytest.raises(DirectoryInUseError, match="another CheckpointManager"):
        b.save(checkpoint_number=99)
    # A's save (ckpt-2) won: listed, latest, and B's rotation deleted nothing of A's
    assert sp.latest_checkpoint(url) == f"{url}/ckpt-2"
    assert sp.CheckpointManager(_ck(0.0), url).checkpoints == [f"{url}/ckpt-1", f"{url}/ckpt-2"]
    for n, want in ((1, 1.0), (2, 2.0)):
        ck = _ck(0.0)
        ck.restore(f"{url}/ckpt-{n}").assert_consumed()
        assert _value(ck) == want
    with pytest.raises(DirectoryInUseError):
        b.save(checkpoint_number=100)  # B stays out until recreated


def test_incremental_refused_on_urls(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match="incremental"):
        sp.CheckpointManager(_ck(0.0), url, incremental=True)
