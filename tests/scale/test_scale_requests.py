"""The scale harness at N = 64 (docs/SCALE.md; the N = 4,096 figures live in
benches/bench_scale.py): request counts per rank and per commit against a real S3 server (moto
behind a counting proxy), the merge's partial-index reads in parallel, no LIST or HEAD in a
save, and `gc` clearing what a save whose coordinator died left."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("boto3", reason="needs boto3 (requirements-dev)")

import scale_harness as h  # noqa: E402 - after the importorskips
import shardpoint as sp  # noqa: E402
from s3_server import Moto, Proxy, moto_environment, opts_for  # noqa: E402
from shardpoint.errors import NotFoundError  # noqa: E402

N = 64
TENSORS = 10


@pytest.fixture(scope="module")
def moto():
    with moto_environment() as m:
        yield m


@pytest.fixture
def proxy(moto: Moto):
    p = Proxy(moto.port)
    try:
        yield p
    finally:
        p.close()


def test_writer_save_requests_and_parallel_merge(moto: Moto, proxy: Proxy) -> None:
    """Each rank: one PUT for its shard, one for its partial index, nothing else. The merge:
    one GET of the index it replaces, N GETs of partials with many in flight at once (20 ms
    per request added), one PUT, one bulk delete; no LIST, no HEAD."""
    url = f"s3://{moto.bucket()}/w/ckpt"
    opts = opts_for(proxy)
    proxy.latency = 0.02
    run = h.writer_save(url, N, tensors=TENSORS, proxy=proxy, moto=moto, options=opts)
    assert run.rank_requests == {"PUT": 2.0}, run.rank_requests
    assert run.commit_requests == {"GET": N + 1, "PUT": 1, "BULK_DELETE": 1}, run.commit_requests
    assert proxy.max_inflight > 8, proxy.max_inflight  # the partials were read in parallel
    assert run.objects_per_rank == 1.0 + 1 / N  # one shard per rank, and the index
    proxy.latency = 0.0
    h.check_writer_checkpoint(url, N, TENSORS, 4, opts)


def test_merge_requests_grow_linearly(moto: Moto, proxy: Proxy) -> None:
    """The coordinator's requests are N + 3 at every N (no per-rank listing, no retries)."""
    opts = opts_for(proxy)
    for n in (8, 32):
        url = f"s3://{moto.bucket()}/g{n}/ckpt"
        run = h.writer_save(url, n, tensors=2, proxy=proxy, moto=moto, options=opts)
        assert sum(run.commit_requests.values()) == n + 3, run.commit_requests


def test_save_file_makes_no_list_or_head(moto: Moto, proxy: Proxy) -> None:
    """A first save: one GET (is there a checkpoint to replace?), the shard's PUT, the index's
    PUT. Replacing it: the same, plus one delete of the shards it replaced."""
    url = f"s3://{moto.bucket()}/one/ckpt"
    opts = opts_for(proxy)
    proxy.reset()
    sp.save_file({"a": np.arange(10)}, url, storage_options=opts)
    assert proxy.counts() == {"GET": 1, "PUT": 2}, proxy.counts()
    proxy.reset()
    sp.save_file({"a": np.arange(11)}, url, storage_options=opts)
    counts = proxy.counts()
    assert counts.pop("GET") == 1 and counts.pop("PUT") == 2, proxy.counts()
    assert counts in ({"BULK_DELETE": 1}, {"DELETE": 1}), proxy.counts()
    bucket = url.split("/")[2]
    assert sum(".data-" in k for k in moto.keys(bucket)) == 1
    np.testing.assert_array_equal(sp.load_file(url)["a"], np.arange(11))


def test_dcp_save_through_our_storage_writer(moto: Moto, proxy: Proxy) -> None:
    """DCP's planner's plans for N row-sharded ranks, our StorageWriter: each rank two PUTs;
    the merge reads no partial (FORMAT.md §8.4); the checkpoint holds every shard and DCP's
    metadata."""
    pytest.importorskip("torch")
    url = f"s3://{moto.bucket()}/dcp/ckpt"
    opts = opts_for(proxy)
    run = h.dcp_save(url, N, tensors=TENSORS, proxy=proxy, moto=moto, options=opts)
    assert run.rank_requests == {"PUT": 2.0}, run.rank_requests
    # finish: the metadata writer's shard and partial, the index it replaces (one GET), the
    # index and one bulk delete; the ranks' partials came with their results, never read back
    assert run.commit_requests == {"GET": 1, "PUT": 3, "BULK_DELETE": 1}, run.commit_requests
    assert run.bytes_to_coordinator > 0 and run.bytes_from_coordinator > 0
    assert run.objects_per_rank == 1.0 + 2 / N  # the consumed partials were deleted
    with sp.open(url, storage_options=opts) as r:
        assert len(r) == N * TENSORS + 2  # the shards, DCP's metadata and its chunk table
        np.testing.assert_array_equal(r[f"t000@{N - 1},0"], np.full((1, 4), N - 1, np.float32))


def test_coordinator_death_leaves_previous_checkpoint_and_gc_clears(moto: Moto) -> None:
    """Every rank published its partial, the coordinator died before the merge: the new
    checkpoint is never visible, the previous one loads unchanged, and `gc` removes the
    unreferenced shards and partial indexes (never the previous checkpoint's)."""
    bucket = moto.bucket()
    url = f"s3://{bucket}/dead/ckpt"
    h.writer_save(url, 4, tensors=2, token="first")
    before = set(moto.keys(bucket))
    for r in range(4):  # the second save's ranks; no merge follows
        with sp.Writer(url, rank=r, world_size=4, compression="none", merge_token="second") as w:
            w.add(f"new{r}", np.arange(3))
    assert len(moto.keys(bucket)) == len(before) + 8
    with pytest.raises(KeyError):
        sp.open(url)["new0"]
    h.check_writer_checkpoint(url, 4, 2, 4)
    assert sp.storage.gc(f"s3://{bucket}/dead", older_than=0) == 8
    assert set(moto.keys(bucket)) == before
    h.check_writer_checkpoint(url, 4, 2, 4)
    h.writer_save(url, 4, tensors=2, token="third")  # the next save succeeds
    h.check_writer_checkpoint(url, 4, 2, 4)


def test_gc_with_no_checkpoint_removes_partials(moto: Moto) -> None:
    """Ranks of a first save published partials, no index was ever committed: not a checkpoint,
    and `gc` removes all of it."""
    bucket = moto.bucket()
    url = f"s3://{bucket}/never/ckpt"
    for r in range(2):
        with sp.Writer(url, rank=r, world_size=2, compression="none") as w:
            w.add(f"k{r}", np.arange(2))
    with pytest.raises(NotFoundError):
        sp.open(url)
    assert sp.storage.gc(f"s3://{bucket}/never", older_than=0) == 4
    assert moto.keys(bucket) == []


def test_multipart_shard_requests(moto: Moto, proxy: Proxy) -> None:
    """A rank whose shard is larger than one part: create, the parts, complete, and its
    partial index: parts + 2 requests beside its data objects (the parts and the partial),
    no marker (``gc`` finds a killed writer's upload with ListMultipartUploads), no LIST or
    HEAD; nothing left after the commit."""
    bucket = moto.bucket()
    url = f"s3://{bucket}/mp/ckpt"
    opts = opts_for(proxy, part_size=str(5 << 20))
    big = np.random.default_rng(0).random((11 << 20) // 8)  # 11 MiB: parts of 5, 5 and 1 MiB
    proxy.reset()
    with sp.Writer(url, rank=0, world_size=2, compression="none", storage_options=opts) as w:
        w.add("big", big)
    rank0 = proxy.counts()
    # create + 3 parts + complete + partial PUT = (3 parts + 1 partial) + 2
    assert rank0 == {"MP_CREATE": 1, "MP_PART": 3, "MP_COMPLETE": 1, "PUT": 1}, rank0
    assert sum(rank0.values()) == (rank0["MP_PART"] + rank0["PUT"]) + 2
    assert not any(k.endswith(".upload") for k in moto.keys(bucket)), moto.keys(bucket)
    proxy.reset()
    with sp.Writer(url, rank=1, world_size=2, compression="none", storage_options=opts) as w:
        w.add("small", np.arange(3))
    assert proxy.counts() == {"PUT": 2}, proxy.counts()  # shard + partial
    proxy.reset()
    sp.merge(url, 2, storage_options=opts)
    assert proxy.counts() == {"GET": 3, "PUT": 1, "BULK_DELETE": 1}, proxy.counts()
    assert moto.uploads(bucket) == []
    np.testing.assert_array_equal(sp.load_file(url, storage_options=opts)["big"], big)
