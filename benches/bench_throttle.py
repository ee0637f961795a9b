"""Hashed key prefixes against a store that throttles per key prefix (docs/SCALE.md "A store
that throttles"): N writers (threads, one small shard each) save one checkpoint on a moto S3
server behind the fault proxy of tests/s3_server.py (in a process of its own), which answers
``503 SlowDown`` to requests over ``--rate`` per second per key prefix (bucket ``--burst``),
as S3's partitions do. Side by side in one run, per N: the flat layout (every shard and
partial index under the checkpoint's directory: one prefix) and ``hashed_prefixes=True``.

    python benches/bench_throttle.py --ns 64 256 --rate 100 --burst 50

Reports per layout: the writers' phase wall time (every rank's shard and partial index up),
the merge's wall time (partials read, index committed, cleanup), the 503s answered (each one a
retry by the client: a save that commits retried every one), requests, prefixes used and the
busiest prefix's requests. The rate is scaled down from S3's 3,500 writes / 5,500 reads a
second per prefix to what a proxy on one machine serves, so the ratios are what carries over.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benches"))

import shardpoint as sp  # noqa: E402
from proxy_process import ProxyProcess  # noqa: E402
from s3_server import moto_environment, opts_for  # noqa: E402


def _run(url: str, n: int, proxy: ProxyProcess, hashed: bool) -> str:
    opts = opts_for(proxy, max_retries="30", retry_timeout="600")  # type: ignore[arg-type]
    token = "b" * 32
    errors: list[BaseException] = []
    go = threading.Barrier(n)

    def rank(r: int) -> None:
        try:
            w = sp.Writer(
                url, rank=r, world_size=n, merge_token=token, storage_options=opts,
                hashed_prefixes=hashed, durable=False,
            )  # fmt: skip
            w.add(f"rank{r:05d}/w", np.full(64, r, dtype=np.float32))
            go.wait()
            w.commit()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    proxy.per_prefix_rate(args.rate, args.burst)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    t1 = time.perf_counter()
    writers_slow = sum(proxy.slowdowns()[0].values())
    sp.merge(url, n, token=token, storage_options=opts, hashed_prefixes=hashed)
    t2 = time.perf_counter()
    slow, reqs = proxy.slowdowns()
    proxy.per_prefix_rate(None)
    got = sp.load_file(url)  # not through the proxy: bit-exact and complete
    assert len(got) == n and all(float(got[f"rank{r:05d}/w"][0]) == r for r in range(n))
    name = "hashed" if hashed else "flat"
    return (
        f"N={n:5d} {name:6s} writers_wall={t1 - t0:6.2f}s merge_wall={t2 - t1:6.2f}s "
        f"503s={sum(slow.values()):5d} (writers {writers_slow}, merge "
        f"{sum(slow.values()) - writers_slow}) requests={sum(reqs.values()):5d} "
        f"prefixes={len(reqs):4d} busiest={max(reqs.values()):5d}"
    )


def main() -> None:
    with moto_environment() as moto:
        proxy = ProxyProcess(moto.port)
        try:
            for n in args.ns:
                for hashed in (False, True):
                    url = f"s3://{moto.bucket()}/ckpts/run"
                    print(_run(url, n, proxy, hashed), flush=True)
        finally:
            proxy.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rate", type=float, default=100.0, help="requests/s per key prefix")
    ap.add_argument("--burst", type=float, default=50.0, help="requests a prefix may burst")
    args = ap.parse_args()
    main()
