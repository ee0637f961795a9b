"""The tiered manager in one process (no process group), its restore plan and its message
decoder: local and persistent tiers, retention per tier, a wiped or damaged local tier, the
persistent tier on a directory and on the local S3 server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.errors import CorruptCheckpointError
from shardpoint.tiers import FAULT_ENV
from shardpoint.tiers.layout import COMMIT_SUFFIX, own_dir, part_prefix, read_record, write_record
from shardpoint.tiers.parts import (
    Part,
    PartFile,
    decode_parts,
    encode_parts,
    map_part_pieces,
    read_parts_message,
)
from shardpoint.tiers.plan import choose_plan


def _state(step: int) -> np.ndarray:
    return np.arange(5000, dtype=np.float32) * 3 + step


def _manager(tmp, persistent=None, **kw):
    w = sp.Variable(np.zeros(5000, dtype=np.float32))
    step = sp.Variable(np.int64(-1))
    ckpt = sp.Checkpoint(w=w, step=step)
    kw.setdefault("local_every", 2)
    kw.setdefault("persistent_every", 4)
    m = sp.TieredCheckpointManager(
        ckpt,
        persistent or str(tmp / "persistent"),
        local_directory=str(tmp / "local"),
        **kw,
    )
    return m, w, step


def _save(m, w, step_var, steps):
    for s in steps:
        w.assign(_state(s))
        step_var.assign(np.int64(s))
        m.save(s)
    m.wait()


def _committed(directory):
    return sorted(
        int(n[len("ckpt-") : -len(COMMIT_SUFFIX)])
        for n in os.listdir(directory)
        if n.endswith(COMMIT_SUFFIX)
    )


def test_every_k_local_every_m_persistent_and_retention_per_tier(tmp_path):
    m, w, s = _manager(tmp_path, local_max_to_keep=2, max_to_keep=2)
    fut = m.save(1)
    assert fut is None  # not due: 1 % 2
    _save(m, w, s, range(1, 17))
    m.close()
    assert _committed(own_dir(str(tmp_path / "local"), 0))[-2:] == [14, 16]
    assert len(_committed(own_dir(str(tmp_path / "local"), 0))) <= 3  # one may be pinned
    assert sorted(os.listdir(tmp_path / "persistent")) == ["ckpt-12", "ckpt-16"]
    m2, w2, s2 = _manager(tmp_path)
    assert m2.restore_or_initialize() == 16
    assert np.array_equal(w2.numpy(), _state(16)) and int(s2.numpy()) == 16
    assert [p.tier for p in m2.restore_plan().sources] == ["local"]
    m2.close()


def test_wiped_local_tier_restores_from_persistent_and_refills_local(tmp_path):
    m, w, s = _manager(tmp_path)
    _save(m, w, s, range(1, 11))  # local 2..10, persistent 4 and 8
    m.close()
    shutil.rmtree(tmp_path / "local")
    m2, w2, s2 = _manager(tmp_path)
    assert m2.restore_or_initialize() == 8
    assert np.array_equal(w2.numpy(), _state(8))
    assert [p.tier for p in m2.restore_plan().sources] == ["persistent"]
    # the local tier holds the restored part again, committed in the background
    assert _committed(own_dir(str(tmp_path / "local"), 0)) in ([], [8])
    m2.wait()
    assert _committed(own_dir(str(tmp_path / "local"), 0)) == [8]
    m2.close()


def test_damaged_local_part_falls_back_to_an_intact_copy(tmp_path):
    m, w, s = _manager(tmp_path, persistent_every=8)
    _save(m, w, s, range(1, 9))  # local 6, 8; persistent 8
    m.close()
    prefix = part_prefix(own_dir(str(tmp_path / "local"), 0), 8)
    shard = next(p for p in os.listdir(os.path.dirname(prefix)) if ".data-" in p and "ckpt-8." in p)
    path = os.path.join(os.path.dirname(prefix), shard)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    m2, w2, s2 = _manager(tmp_path, persistent_every=8)
    assert m2.restore_or_initialize() == 8
    assert np.array_equal(w2.numpy(), _state(8))
    plan = m2.restore_plan()
    assert [p.tier for p in plan.sources] == ["persistent"]
    assert plan.excluded and "local" in plan.excluded[0]
    m2.close()


def test_a_newer_persistent_step_wins_over_an_older_local_one(tmp_path):
    m, w, s = _manager(tmp_path)
    _save(m, w, s, range(1, 9))  # local 6, 8; persistent 4, 8
    m.close()
    own = own_dir(str(tmp_path / "local"), 0)
    os.unlink(part_prefix(own, 8) + COMMIT_SUFFIX)  # local step 8 lost: its record gone
    m2, w2, s2 = _manager(tmp_path)
    # the local tier's step 6 is restored while the persistent tier is listed; its step 8 is
    # newer and complete, so it is restored after
    assert m2.restore_or_initialize() == 8
    assert np.array_equal(w2.numpy(), _state(8)) and int(s2.numpy()) == 8
    assert [p.tier for p in m2.restore_plan().sources] == ["persistent"]
    m2.close()


def test_nothing_anywhere_calls_init_fn(tmp_path):
    called = []
    m, _, _ = _manager(tmp_path, init_fn=lambda: called.append(1))
    assert m.restore_or_initialize() is None and called == [1]
    assert m.restore_plan().step is None
    m.close()


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(sp.InvalidArgumentError, match="local_every"):
        _manager(tmp_path, local_every=0)
    with pytest.raises(sp.InvalidArgumentError, match="replicas"):
        _manager(tmp_path, replicas=-1)


def test_commit_records_absent_or_malformed_do_not_count(tmp_path):
    # absent: a local file and an object (NotFoundError from the store), never an error
    assert read_record(str(tmp_path / "none.json")) is None
    assert read_record("memory://tiers-records/none.json") is None
    write_record("memory://tiers-records/ok.json", {"step": 3, "token": "a.0"})
    assert read_record("memory://tiers-records/ok.json") == {"step": 3, "token": "a.0"}
    for bad in (b"[1, 2]", b'{"step": "3", "token": "a"}', b'{"step": true, "token": "a"}',
                b'{"step": 3}', b"\xff not json"):  # fmt: skip
        path = tmp_path / "bad.json"
        path.write_bytes(bad)
        assert read_record(str(path)) is None, bad


def test_plan_never_mixes_saves_and_prefers_cheap_tiers():
    def c(owner, step, token, prefix="p"):
        return {"owner": owner, "step": step, "token": token, "prefix": prefix}

    node_of = [0, 0, 1, 1]
    inv = [
        [c(0, 30, "b"), c(0, 20, "a"), c(2, 20, "a")],
        [c(1, 30, "b"), c(1, 20, "a"), c(3, 20, "a")],
        [c(2, 30, "OTHER")],  # a part of step 30 from another save: must not combine
        [],
    ]
    persistent = [{"step": 20, "token": "a", "world": 4}]
    plan = choose_plan(4, node_of, inv, persistent, lambda s, o: f"url/{s}/{o}", set())
    assert plan.step == 20 and plan.token == "a"
    assert [s.tier for s in plan.sources] == ["local", "local", "peer", "peer"]
    excluded = {(20, 2, "peer", 0)}
    plan = choose_plan(4, node_of, inv, persistent, lambda s, o: f"url/{s}/{o}", excluded)
    assert [s.tier for s in plan.sources] == ["local", "local", "persistent", "peer"]
    assert choose_plan(4, node_of, inv, [], lambda s, o: "", {(20, 2, "peer", 0)}).step is None


def test_messages_are_checked_as_hostile_input():
    part = Part(
        1, 10, "t", [PartFile(".data-00000-of-00001", b"abc", 0), PartFile(".index", b"ix", 0)]
    )
    msg = encode_parts([part])
    (got,) = decode_parts(msg, "rank 1")
    assert bytes(got.files[0].data) == b"abc" and got.files[1].suffix == ".index"
    with pytest.raises(CorruptCheckpointError, match="past the end"):
        decode_parts(msg[:-1], "rank 1")
    with pytest.raises(CorruptCheckpointError, match="trailing"):
        decode_parts(msg + b"x", "rank 1")
    evil = encode_parts([Part(1, 10, "t", [PartFile("/../../etc/x", b"a", 0)])])
    with pytest.raises(CorruptCheckpointError, match="not a checkpoint file suffix"):
        decode_parts(evil, "rank 1")
    with pytest.raises(CorruptCheckpointError, match="magic"):
        decode_parts(b"NOTTIERS" + bytes(8), "rank 1")
    with pytest.raises(sp.ChecksumMismatchError, match="crc32c"):
        part.files[0].check("x")


def test_parts_read_straight_into_a_message(tmp_path):
    prefix = str(tmp_path / "ckpt-3")
    sp.save_file({"a": np.arange(3000, dtype=np.float32), "b": np.ones(7)}, prefix)
    message, (part,) = read_parts_message([(prefix, 2, 3, "t.0", None)])
    (got,) = decode_parts(message, "rank 2")  # the header padded to its room decodes
    assert (got.owner, got.step, got.token) == (2, 3, "t.0")
    assert [f.suffix for f in got.files][-1] == ".index"
    for mine, theirs in zip(part.files, got.files, strict=True):
        assert bytes(mine.data) == bytes(theirs.data) == open(prefix + mine.suffix, "rb").read()
        assert mine.crc == theirs.crc == sp.storage.crc32c(mine.data)
        theirs.check("x")
    # with a commit record the files carry its crcs: damage on disk since then is caught
    record = [[f.suffix, len(f.data), f.crc] for f in part.files]
    shard = prefix + part.files[0].suffix
    raw = bytearray(open(shard, "rb").read())
    raw[len(raw) // 2] ^= 1
    open(shard, "wb").write(bytes(raw))
    _, (damaged,) = read_parts_message([(prefix, 2, 3, "t.0", record)])
    with pytest.raises(sp.ChecksumMismatchError, match="crc32c"):
        damaged.files[0].check(prefix)
    with pytest.raises(CorruptCheckpointError, match="commit record"):
        read_parts_message([(prefix, 2, 3, "t.0", record[:-1])])


def test_mapped_pieces_joined_decode_as_the_message(tmp_path):
    """A peer restore sends a part as pieces mapped from its files (no copy into a message);
    joined, as the receiver receives them, they decode as read_parts_message's message, the
    crcs those of the commit record (so damage since the commit is caught on arrival)."""
    prefix = str(tmp_path / "ckpt-3")
    sp.save_file({"a": np.arange(3000, dtype=np.float32), "b": np.ones(7)}, prefix)
    message, (part,) = read_parts_message([(prefix, 2, 3, "t.0", None)])
    record = [[f.suffix, len(f.data), f.crc] for f in part.files]
    pieces, mapped = map_part_pieces((prefix, 2, 3, "t.0", record))
    assert len(pieces) == 1 + len(part.files)
    assert [(f.suffix, bytes(f.data), f.crc) for f in mapped.files] == [
        (f.suffix, bytes(f.data), f.crc) for f in part.files
    ]
    # without a record the crcs are computed from the mapped bytes
    _, fresh = map_part_pieces((prefix, 2, 3, "t.0", None))
    assert [f.crc for f in fresh.files] == [f.crc for f in part.files]
    (got,) = decode_parts(b"".join(bytes(p) for p in pieces), "rank 2")
    (want,) = decode_parts(message, "rank 2")
    assert (got.owner, got.step, got.token) == (2, 3, "t.0")
    assert [(f.suffix, bytes(f.data), f.crc) for f in got.files] == [
        (f.suffix, bytes(f.data), f.crc) for f in want.files
    ]
    shard = prefix + part.files[0].suffix
    raw = bytearray(open(shard, "rb").read())
    raw[len(raw) // 2] ^= 1
    open(shard, "wb").write(bytes(raw))
    (damaged,) = decode_parts(
        b"".join(bytes(p) for p in map_part_pieces((prefix, 2, 3, "t.0", record))[0]), "rank 2"
    )
    with pytest.raises(sp.ChecksumMismatchError, match="crc32c"):
        damaged.files[0].check(prefix)
    with pytest.raises(CorruptCheckpointError, match="commit record"):
        map_part_pieces((prefix, 2, 3, "t.0", record[:-1]))


def test_fault_point_kills_by_signal_only_where_named(tmp_path):
    code = (
        f"import sys; sys.path[:0] = [{os.path.dirname(os.path.dirname(sp.__file__))!r}]\n"
        "from shardpoint.tiers.faults import fault_point\n"
        "fault_point('local:after-part', 1, 10)\n"
        "fault_point('commit:after-agree', 0, 10)\n"
        "fault_point('commit:after-agree', 1, 20)\n"
        "print('alive')\n"
        "fault_point('commit:after-agree', 1, 10)\n"
        "print('not reached')\n"
    )
    env = dict(os.environ, **{FAULT_ENV: "commit:after-agree@1#10"})
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == -9 and r.stdout == "alive\n"


def test_persistent_tier_on_s3(tmp_path):
    pytest.importorskip("moto.server")
    from s3_server import moto_environment

    with moto_environment() as moto:
        bucket = moto.bucket()
        url = f"s3://{bucket}/run"
        m, w, s = _manager(tmp_path, persistent=url, max_to_keep=1)
        _save(m, w, s, range(1, 9))
        m.close()
        keys = moto.keys(bucket)
        assert "run/ckpt-8/tier-commit.json" in keys
        assert not any(k.startswith("run/ckpt-4/") for k in keys)  # retention
        shutil.rmtree(tmp_path / "local")
        m2, w2, _ = _manager(tmp_path, persistent=url)
        assert m2.restore_or_initialize() == 8
        assert np.array_equal(w2.numpy(), _state(8))
        assert [p.tier for p in m2.restore_plan().sources] == ["persistent"]
        m2.close()


def test_local_parts_are_stored_as_is_unless_compression_is_asked(tmp_path):
    """The local tier's codec (``compression``, default none: a restore copies instead of
    decoding) reaches ``Checkpoint.write``; the persistent tier gets the same bytes."""
    sizes = {}
    for name, kw in (("raw", {}), ("zstd", {"compression": "zstd"})):
        w = sp.Variable(np.zeros(50_000, dtype=np.float32))  # 200 kB of zeros: compressible
        m = sp.TieredCheckpointManager(
            sp.Checkpoint(w=w), tmp_path / name / "bucket",
            local_directory=tmp_path / name / "nvme", local_every=1, persistent_every=1, **kw,
        )  # fmt: skip
        m.save(1)
        m.close()
        own = own_dir(str(tmp_path / name / "nvme"), 0)
        data = [f for f in os.listdir(own) if ".data-" in f]
        sizes[name] = sum(os.path.getsize(os.path.join(own, f)) for f in data)
        uploaded = tmp_path / name / "bucket" / "ckpt-1"
        assert sum(p.stat().st_size for p in uploaded.glob("part-00000.data-*")) == sizes[name]
        w.assign(np.ones(50_000, dtype=np.float32))
        again = sp.TieredCheckpointManager(
            sp.Checkpoint(w=w), tmp_path / name / "bucket", local_directory=tmp_path / name / "nvme"
        )
        assert again.restore_or_initialize() == 1 and not w.numpy().any()
        again.close()
    assert sizes["raw"] >= 200_000 > 20 * sizes["zstd"]


def test_checkpoint_objects_without_a_compression_argument_keep_their_codec(tmp_path):
    class Own:
        def __init__(self):
            self.inner = sp.Checkpoint(w=sp.Variable(np.zeros(10, dtype=np.float32)))

        def write(self, prefix, blocking=True):
            return self.inner.write(prefix, blocking=blocking)

        def restore(self, prefix, verify=True):
            self.inner.restore(prefix)

    m = sp.TieredCheckpointManager(
        Own(), tmp_path / "bucket", local_directory=tmp_path / "nvme", local_every=1
    )
    assert m.save(1).result() == 1
    m.close()
