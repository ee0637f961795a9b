"""Hashed key prefixes against a store that throttles per prefix (docs/SCALE.md "A store that
throttles"): the fault proxy in front of a moto S3 server answers ``503 SlowDown`` once a key
prefix is over its request rate, as S3's partitions do. A save of N writers at one prefix
puts every shard and partial index under ``P.``'s directory, one prefix; with
``hashed_prefixes=True`` they spread over ``P/HH/``. Both commit once and bit-exact (the 503s
are retried); the hashed layout is never throttled, because no prefix of it gets more requests
than the bucket holds, whatever the timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")

import shardpoint as sp  # noqa: E402
from s3_server import Proxy, moto_environment, opts_for  # noqa: E402

N = 8
# a bucket of BURST requests per prefix, refilled at RATE a second: the flat layout's one
# prefix gets 2N + 3 requests at once (N shards, N partials, the merge's GET, PUT and bulk
# delete), far over it; no prefix of the hashed layout gets more than BURST. The rate is low
# so that the flat half's 503 does not hang on timing: to escape one, its 19 requests would
# have to spread over (19 - BURST) / RATE = 3 s, far slower than a loaded CI machine's moto
RATE, BURST = 5.0, 4.0


def _value(r: int) -> np.ndarray:
    return np.arange(256, dtype=np.float32) * (r + 1)


def _save(url: str, proxy: Proxy, hashed: bool) -> None:
    opts = opts_for(proxy, max_retries="12")
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            w = sp.Writer(
                url, rank=r, world_size=N, merge_token="t" * 32, storage_options=opts,
                hashed_prefixes=hashed,
            )  # fmt: skip
            w.add(f"rank{r}/w", _value(r))
            w.commit()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    sp.merge(url, N, token="t" * 32, storage_options=opts, hashed_prefixes=hashed)


@pytest.mark.parametrize("hashed", [False, True], ids=["flat", "hashed"])
def test_throttled_prefixes(hashed: bool) -> None:
    with moto_environment() as moto:
        bucket = moto.bucket()
        url = f"s3://{bucket}/ckpts/run"
        proxy = Proxy(moto.port)
        try:
            proxy.per_prefix_rate(RATE, BURST)
            _save(url, proxy, hashed)
            index = f"/{bucket}/ckpts/run.index"
            puts = [p for m, p, _ in proxy.requests("PUT") if p == index]
            refused = [p for _, m, p in proxy.faults if m == "PUT" and p == index]
            slowdowns = dict(proxy.slowdowns)
            per_prefix = dict(proxy.prefix_requests)
        finally:
            proxy.close()
        assert len(puts) - len(refused) == 1  # committed exactly once
        got = sp.load_file(url)  # straight from moto, not through the proxy
        assert sorted(got) == [f"rank{r}/w" for r in range(N)]
        for r in range(N):
            np.testing.assert_array_equal(got[f"rank{r}/w"], _value(r))
    writes = {p: n for p, n in per_prefix.items() if "/ckpts/" in p}
    if hashed:
        assert slowdowns == {}, slowdowns
        assert max(writes.values()) <= BURST, writes  # why it is never throttled
        assert len(writes) > N // 2, writes  # the shards and partials spread out
    else:
        assert set(writes) == {f"/{bucket}/ckpts/"}, writes  # one prefix for everything
        assert writes[f"/{bucket}/ckpts/"] >= 2 * N + 3
        assert slowdowns.get(f"/{bucket}/ckpts/", 0) >= 1, slowdowns
