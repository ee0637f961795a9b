"""save_file / open / load_file / Writer / merge / remove on object-store URLs: memory:// for
speed, s3:// against a real moto server."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import shardpoint as sp
from s3_server import aws_environment
from shardpoint.errors import (
    CheckpointIOError,
    ChecksumMismatchError,
    MissingKeyError,
    NotFoundError,
)


def _values() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((300, 257)).astype(np.float32),  # compressible-ish
        "b": np.arange(1000, dtype=np.int64),
        "z": np.zeros((64, 1024), dtype=np.float32),  # compresses well
        "name": "model",
        "step": 7,
        "cfg": {"lr": 0.1, "layers": [1, 2]},
    }


def _check(got: dict[str, object], want: dict[str, object]) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got[k], v)
            assert got[k].dtype == v.dtype
        else:
            assert got[k] == v


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_memory_round_trip(compression: str) -> None:
    url = f"memory://t-{uuid.uuid4().hex}/run/ckpt"
    vals = _values()
    sp.save_file(vals, url, compression=compression, metadata={"step": 7})
    assert sp.exists(url)
    _check(sp.load_file(url), vals)
    with sp.open(url) as r:
        assert r.keys() == sorted(vals)
        assert "w" in r and "nope" not in r
        np.testing.assert_array_equal(r["b"], vals["b"])
        np.testing.assert_array_equal(r.slice("w", 10, 20), vals["w"][10:20])
        assert r.info("w").shape == (300, 257)
        assert r.metadata == {"step": 7}
        r.verify()
        with pytest.raises(MissingKeyError):
            r["nope"]


def test_memory_missing_checkpoint_is_not_found() -> None:
    with pytest.raises(NotFoundError, match="memory://"):
        sp.open(f"memory://t-{uuid.uuid4().hex}/nothing/here")


def test_s3_round_trip_every_file_entry_point(moto, bucket: str) -> None:
    url = f"s3://{bucket}/runs/a/ckpt"
    vals = _values()
    sp.save_file(vals, url, shards=3)
    _check(sp.load_file(url), vals)
    keys = moto.keys(bucket)
    assert "runs/a/ckpt.index" in keys
    assert sum(".data-" in k for k in keys) == 3
    assert not any(k.endswith(".upload") for k in keys)
    with sp.open(url) as r:
        r.verify()
        np.testing.assert_array_equal(r.slice("b", 5, 9), np.arange(5, 9))
        info = r.format_info
        assert all(p.startswith(f"s3://{bucket}/runs/a/ckpt.data-") for p, _ in info["shards"])
    # A second save at the same prefix replaces the first (conditional update) and cleans up.
    sp.save_file({"only": np.ones(4, np.float32)}, url)
    assert sp.load_file(url).keys() == {"only"}
    keys = moto.keys(bucket)
    assert sum(".data-" in k for k in keys) == 1, keys
    sp.remove(url)
    assert not sp.exists(url)
    assert moto.keys(bucket) == []


def test_s3_streaming_writer_multipart(moto, bucket: str) -> None:
    """A shard larger than one part streams as a multipart upload (parts of 5 MiB, 2 in
    flight) and completes; no incomplete upload or marker remains."""
    url = f"s3://{bucket}/big/ckpt"
    opts = {"part_size": str(5 << 20), "concurrency": "2"}
    rng = np.random.default_rng(1)
    arrays = {f"t{i}": rng.standard_normal(1 << 20).astype(np.float32) for i in range(6)}
    with sp.Writer(url, compression="none", shards=2, storage_options=opts) as w:
        for k, v in arrays.items():
            w.add(k, v)
    assert moto.uploads(bucket) == []
    assert not any(k.endswith(".upload") for k in moto.keys(bucket))
    got = sp.load_file(url, storage_options=opts)
    _check(got, arrays)


def test_s3_writer_abort_leaves_nothing(moto, bucket: str) -> None:
    url = f"s3://{bucket}/ab/ckpt"
    opts = {"part_size": str(5 << 20)}
    w = sp.Writer(url, compression="none", storage_options=opts)
    w.add("x", np.zeros(3 << 20, np.float32))  # 12 MiB: two parts already sent
    w.abort()
    assert moto.uploads(bucket) == []
    assert moto.keys(bucket) == []
    assert not sp.exists(url)


def test_s3_multi_writer_merge(moto, bucket: str) -> None:
    url = f"s3://{bucket}/mw/ckpt"
    for rank in range(3):
        with sp.Writer(url, rank=rank, world_size=3, shards=2, merge_token="s1") as w:
            w.add(f"r{rank}", np.full(10, rank, np.int32))
    assert not sp.exists(url)
    sp.merge(url, 3, token="s1")
    got = sp.load_file(url)
    assert sorted(got) == ["r0", "r1", "r2"]
    np.testing.assert_array_equal(got["r2"], np.full(10, 2, np.int32))
    assert not any(".index.part-" in k for k in moto.keys(bucket))


def test_s3_two_writers_cannot_both_win(moto, bucket: str) -> None:
    """Both writers start before either commits: the index PUT is conditional, so the second
    commit fails with a clear error and the first checkpoint stays intact."""
    url = f"s3://{bucket}/race/ckpt"
    a = sp.Writer(url)
    b = sp.Writer(url)
    a.add("who", "a")
    b.add("who", "b")
    a.commit()
    with pytest.raises(CheckpointIOError, match="another writer committed"):
        b.commit()
    assert sp.load_file(url) == {"who": "a"}
    assert sum(".data-" in k for k in moto.keys(bucket)) == 1


def test_s3_corrupt_shard_is_detected(moto, bucket: str) -> None:
    url = f"s3://{bucket}/bad/ckpt"
    sp.save_file({"x": np.arange(4096, dtype=np.int32)}, url, compression="none")
    shard = next(k for k in moto.keys(bucket) if ".data-" in k)
    body = bytearray(moto.s3.get_object(Bucket=bucket, Key=shard)["Body"].read())
    body[5000] ^= 0xFF
    moto.s3.put_object(Bucket=bucket, Key=shard, Body=bytes(body))
    with pytest.raises(ChecksumMismatchError, match="s3://"):
        sp.load_file(url)


def test_s3_missing_bucket_is_clear_error(moto) -> None:
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x/ckpt"
    with pytest.raises((NotFoundError, CheckpointIOError), match="no-such-bucket"):
        sp.save_file({"a": 1}, url)


def test_credentials_never_in_errors(moto, bucket: str) -> None:
    secret = "SUPERSECRETvalue1234567890"
    opts = {"aws_secret_access_key": secret, "aws_access_key_id": "AKIDEXAMPLE"}
    with pytest.raises(Exception) as ei:  # noqa: PT011 - moto may reject or accept the key
        sp.save_file({"a": 1}, f"s3://{bucket}/sec/ckpt", storage_options=opts)
        sp.load_file(f"s3://no-such-{uuid.uuid4().hex[:8]}/x", storage_options=opts)
    assert secret not in str(ei.value)
    assert secret not in repr(ei.value)


def test_a_changed_endpoint_in_the_environment_is_used(moto, bucket: str, proxy) -> None:
    # The core shares one client per bucket; a later AWS_ENDPOINT_URL (a second server started
    # in the same process, as tests and benches do) must reach the new endpoint, not the old one.
    url = f"s3://{bucket}/env/ckpt"
    sp.save_file({"a": np.arange(3)}, url)  # a client on moto's own endpoint
    with aws_environment(proxy.endpoint, "testing", "testing"):
        proxy.reset()
        np.testing.assert_array_equal(sp.load_file(url)["a"], np.arange(3))
        assert proxy.counts().get("GET", 0) >= 1, proxy.counts()
    proxy.reset()
    np.testing.assert_array_equal(sp.load_file(url)["a"], np.arange(3))
    assert proxy.counts() == {}, "back on moto's endpoint, the proxy saw requests"


def test_file_url_is_local(tmp_path) -> None:
    p = tmp_path / "c"
    sp.save_file({"a": np.arange(3)}, f"file://{p}")
    assert (tmp_path / "c.index").exists()
    np.testing.assert_array_equal(sp.load_file(f"file://{p}")["a"], np.arange(3))


def test_memory_save_with_progress_reports_every_byte(monkeypatch) -> None:
    """The progress callback rides the one save path on object-store URLs too (save_at)."""
    from shardpoint.storage import save

    seen: list[int] = []
    totals: list[int] = []

    class _Bar:
        def __init__(self, total: int, desc: str, **_kw: object) -> None:
            totals.append(total)

        def update(self, n: int) -> None:
            seen.append(n)

        def close(self) -> None:
            pass

    monkeypatch.setattr(save, "progress_bar", _Bar)
    url = f"memory://t-{uuid.uuid4().hex}/run/ckpt"
    vals = _values()
    sp.save_file(vals, url, shards=2, progress=True)
    assert len(seen) == len(vals)  # one report per item written
    assert totals == [sum(seen)]  # the bar sees every byte it was told to expect
    _check(sp.load_file(url), vals)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_load_into_existing_arrays_from_an_object_store(compression: str) -> None:
    url = f"memory://t-{uuid.uuid4().hex}/run/ckpt"
    vals = _values()
    sp.save_file(vals, url, compression=compression)
    targets = {k: np.full_like(vals[k], 5) for k in ("w", "b", "z")}
    with sp.open(url) as r:
        r.load_into(targets)
    for k, t in targets.items():
        np.testing.assert_array_equal(t, vals[k])
