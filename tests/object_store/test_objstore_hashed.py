"""Hashed key prefixes (``hashed_prefixes=True``, FORMAT.md §3.1.1) on a real moto S3 server:
object keys ``P/HH/data-…``, reads, a multi-writer merge, ``gc`` of a dead save's hashed objects
(a committed checkpoint's never touched) and ``remove``."""

from __future__ import annotations

import numpy as np

import shardpoint as sp
from reference_crc import crc32c
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


def test_s3_multi_writer_merge_and_gc_of_a_dead_save(moto, bucket: str) -> None:
    url = f"s3://{bucket}/mw/ckpt"
    for r in range(3):
        with sp.Writer(url, rank=r, world_size=3, merge_token="t", hashed_prefixes=True) as w:
            w.add(f"k{r}", np.full(4, r))
    sp.merge(url, 3, token="t")
    kept = moto.keys(bucket)
    assert len([k for k in kept if k.startswith("mw/ckpt/")]) == 3
    # a dead save: one rank published its shard and partial index, nobody merged
    with sp.Writer(f"s3://{bucket}/mw/dead", rank=0, world_size=2, hashed_prefixes=True) as w:
        w.add("x", np.arange(5))
    assert len(moto.keys(bucket)) == len(kept) + 2
    assert gc(f"s3://{bucket}/mw/", older_than=0) == 2
    assert moto.keys(bucket) == kept
    got = sp.load_file(url)
    assert {k: int(v[0]) for k, v in got.items()} == {"k0": 0, "k1": 1, "k2": 2}
