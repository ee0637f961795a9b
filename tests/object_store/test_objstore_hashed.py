"""Hashed key prefixes (``hashed_prefixes=True``, FORMAT.md §3.1.1) on a real moto S3 server:
object keys ``P/HH/data-…``, reads, a multi-writer merge, ``gc`` of a dead save's hashed objects
(a committed checkpoint's never touched) and ``remove``; partial indexes under the hashed
prefixes; the manager's sweep; gc's ages on the store's clock."""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
from reference_crc import crc32c
from s3_server import Proxy, opts_for
from shardpoint.storage import gc


def _hh(s: int, n: int) -> str:
    """The hashed directory of shard ``s`` of ``n`` (FORMAT.md §3.1.1)."""
    return f"{crc32c(f'.data-{s:05d}-of-{n:05d}'.encode()) & 0xFF:02x}"


def test_s3_round_trip_keys_under_hashed_prefixes(moto, bucket: str) -> None:
    url = f"s3://{bucket}/run/ckpt"
    vals = {f"w{i}": np.arange(500, dtype=np.float32) * i for i in range(4)}
    sp.save_file(vals, url, shards=3, hashed_prefixes=True)
    keys = moto.keys(bucket)
    assert "run/ckpt.index" in keys
    shard_keys = sorted(k for k in keys if k != "run/ckpt.index")
    assert [k.rsplit(".", 1)[0] for k in shard_keys] == sorted(
        f"run/ckpt/{_hh(s, 3)}/data-{s:05d}-of-00003" for s in range(3)
    )  # each carries its save token (FORMAT.md §8.2)
    got = sp.load_file(url)
    for k, v in vals.items():
        np.testing.assert_array_equal(got[k], v)
    with sp.open(url) as r:
        r.verify()
        out = {k: np.empty_like(v) for k, v in vals.items()}
        r.load_into(out)
        np.testing.assert_array_equal(out["w3"], vals["w3"])
    # a save over it: the replaced hashed objects are deleted by the commit (no listing)
    sp.save_file({"a": np.arange(3)}, url, shards=2, hashed_prefixes=True)
    assert len([k for k in moto.keys(bucket) if k.startswith("run/ckpt/")]) == 2
    sp.remove(url)
    assert moto.keys(bucket) == []


def _part(rank: int, world: int) -> str:
    """The hashed partial index name of a rank (FORMAT.md §3.1.1)."""
    plain = f".index.part-{rank:05d}-of-{world:05d}"
    return f"{crc32c(plain.encode()) & 0xFF:02x}/index.part-{rank:05d}-of-{world:05d}"


def test_s3_multi_writer_merge_and_gc_of_a_dead_save(moto, bucket: str) -> None:
    url = f"s3://{bucket}/mw/ckpt"
    for r in range(3):
        with sp.Writer(url, rank=r, world_size=3, merge_token="t", hashed_prefixes=True) as w:
            w.add(f"k{r}", np.full(4, r))
    # the partial indexes spread over the hashed prefixes like the shards
    assert sorted(k for k in moto.keys(bucket) if "index.part" in k) == sorted(
        f"mw/ckpt/{_part(r, 3)}" for r in range(3)
    )
    with pytest.raises(sp.NotFoundError, match="hashed_prefixes=True"):
        sp.merge(url, 3, token="t")
    sp.merge(url, 3, token="t", hashed_prefixes=True)
    kept = moto.keys(bucket)
    assert len([k for k in kept if k.startswith("mw/ckpt/")]) == 3 and len(kept) == 4
    # a dead save: one rank published its shard and partial index, nobody merged
    with sp.Writer(f"s3://{bucket}/mw/dead", rank=0, world_size=2, hashed_prefixes=True) as w:
        w.add("x", np.arange(5))
    assert f"mw/dead/{_part(0, 2)}" in moto.keys(bucket)
    assert len(moto.keys(bucket)) == len(kept) + 2
    # a gc of a checkpoint's own hashed directory finds its index outside that listing
    assert gc(f"s3://{bucket}/mw/ckpt/", older_than=0) == 0
    assert gc(f"s3://{bucket}/mw/", older_than=0) == 2
    assert moto.keys(bucket) == kept
    got = sp.load_file(url)
    assert {k: int(v[0]) for k, v in got.items()} == {"k0": 0, "k1": 1, "k2": 2}


def test_s3_manager_sweeps_hashed_checkpoints(moto, bucket: str) -> None:
    url = f"s3://{bucket}/run"
    v = sp.Variable(np.zeros(4, np.float32))
    m = sp.CheckpointManager(sp.Checkpoint(v=v), url, max_to_keep=1, hashed_prefixes=True)
    m.save()
    m.save()  # rotates ckpt-1 out: its hashed objects go with it
    assert not [k for k in moto.keys(bucket) if k.startswith("run/ckpt-1")]
    moto.s3.delete_object(Bucket=bucket, Key="run/ckpt-2.index")  # a removal cut short
    m.save()
    assert not [k for k in moto.keys(bucket) if k.startswith("run/ckpt-2")]
    assert [k for k in moto.keys(bucket) if k.startswith("run/ckpt-")][0].startswith("run/ckpt-3")


@pytest.mark.parametrize("date", [True, False], ids=["date-header", "no-date-probe"])
def test_s3_gc_ages_objects_on_the_stores_clock(
    moto, bucket: str, proxy: Proxy, date: bool
) -> None:
    """A store whose clock is two hours behind this machine's: a dead save's objects written
    a moment ago are a moment old (on the store's clock, which ``LastModified`` is on), not
    two hours, so ``gc(older_than=1 h)`` keeps them (a live writer's too). The store's "now"
    is the ``Date`` of its upload listing or, when its answers carry no ``Date`` (as other
    stores' listings), the ``LastModified`` of an object gc writes and deletes."""
    opts = opts_for(proxy)
    proxy.send_date = date
    with sp.Writer(f"s3://{bucket}/run/dead", rank=0, world_size=2, storage_options=opts) as w:
        w.add("x", np.arange(5))
    proxy.clock_skew = -7200.0
    assert len(moto.keys(bucket)) == 2
    proxy.reset()
    assert gc(f"s3://{bucket}/run/", older_than=3600, storage_options=opts) == 0
    assert len(moto.keys(bucket)) == 2  # the clock probe is gone too
    puts = [p for m, p, _ in proxy.requests() if m == "PUT"]
    assert len(puts) == (0 if date else 1), puts
    assert gc(f"s3://{bucket}/run/", older_than=0, storage_options=opts) == 2
    assert moto.keys(bucket) == []
