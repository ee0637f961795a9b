"""Saves under a faulty S3 (issue 42, part 3; docs/SCALE.md "Retries"): a real HTTP proxy in
front of moto answers 10% of requests with 503 SlowDown and drops 1% of connections, at
random. The object-store client's retries (object_store's RetryConfig: exponential backoff
with jitter, bounded by ``max_retries`` and ``retry_timeout``) absorb them: every save, single
writer and 4 ranks + merge, returns, commits its index exactly once, reads back bit-exact, and
``gc`` then finds nothing to remove."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")

import shardpoint as sp  # noqa: E402
from s3_server import Proxy, moto_environment, opts_for  # noqa: E402

SAVES = 8
RANKS = 4


def _value(i: int, r: int) -> np.ndarray:
    return (np.arange(64, dtype=np.float32) + i * 100 + r).reshape(8, 8)


def _index_puts(proxy: Proxy, prefix: str) -> int:
    """PUTs of ``prefix.index`` that reached the store (sent, minus those the proxy failed)."""
    key = "/" + prefix.removeprefix("s3://") + ".index"
    sent = [r for r in proxy.requests("PUT") if r[1].split("?")[0] == key]
    failed = [f for f in proxy.faults if f[1] == "PUT" and f[2].split("?")[0] == key]
    return len(sent) - len(failed)


def test_saves_commit_exactly_once_under_503s_and_drops() -> None:
    with moto_environment() as moto:
        proxy = Proxy(moto.port)
        try:
            bucket = moto.bucket()
            opts = opts_for(proxy)
            proxy.random_faults({"503": 0.10, "drop": 0.01}, seed=42)
            prefixes = []
            for i in range(SAVES):
                one = f"s3://{bucket}/single/ckpt-{i}"
                sp.save_file({"v": _value(i, 0)}, one, storage_options=opts)
                many = f"s3://{bucket}/ranks/ckpt-{i}"

                def rank(r: int, many: str = many, i: int = i) -> None:
                    with sp.Writer(
                        many, rank=r, world_size=RANKS, merge_token=str(i), storage_options=opts
                    ) as w:
                        w.add(f"r{r}", _value(i, r))

                with ThreadPoolExecutor(RANKS) as pool:
                    list(pool.map(rank, range(RANKS)))
                sp.merge(many, RANKS, token=str(i), storage_options=opts)
                prefixes += [one, many]
            injected = dict(proxy.injected)
            proxy.random_faults(None)
            assert injected.get("503", 0) >= 10, injected  # faults did happen
            print(f"\n{len(proxy.requests())} requests, faults injected: {injected}")
            for p in prefixes:
                assert _index_puts(proxy, p) == 1, p  # committed exactly once
            for i in range(SAVES):
                got = sp.load_file(f"s3://{bucket}/single/ckpt-{i}", storage_options=opts)
                assert got["v"].tobytes() == _value(i, 0).tobytes()
                got = sp.load_file(f"s3://{bucket}/ranks/ckpt-{i}", storage_options=opts)
                assert {k: v.tobytes() for k, v in got.items()} == {
                    f"r{r}": _value(i, r).tobytes() for r in range(RANKS)
                }
            keys = moto.keys(bucket)
            assert len(keys) == SAVES * (2 + RANKS + 1), keys  # shards and indexes only
            assert sp.storage.gc(f"s3://{bucket}", older_than=0, storage_options=opts) == 0
            assert moto.uploads(bucket) == []
        finally:
            proxy.close()


@pytest.mark.parametrize("after", [2, 4])
def test_a_failed_multipart_save_aborts_its_upload(after: int) -> None:
    """A save whose upload fails for good (a 403 ``after`` requests in: a part, the first
    or the third, after the index GET and creating the upload) raises and leaves nothing: no
    multipart upload, no shard. (A killed writer's upload is ``gc``'s, found with
    ListMultipartUploads: tests/scale/test_gc_uploads.py.)"""
    with moto_environment() as moto:
        proxy = Proxy(moto.port)
        try:
            bucket = moto.bucket()
            opts = opts_for(proxy, part_size=str(5 << 20))
            big = {"w": np.arange(3 << 20, dtype=np.float32)}  # 12 MiB: 3 parts
            proxy.fail_after(after, "403")
            with pytest.raises(sp.CheckpointError):
                sp.save_file(
                    big, f"s3://{bucket}/mp/ckpt", compression="none", storage_options=opts
                )
            assert moto.uploads(bucket) == []
            assert moto.keys(bucket) == []
        finally:
            proxy.close()
