"""Object-store benchmark: shardpoint save/load to S3 (benches/s3server.py: our Rust server on
localhost, moto where cargo is missing or with --s3-server moto) beside raw obstore
upload/download of the same bytes and torch.save to BytesIO + upload, in one run.

Not a test: it prints figures and ratios measured side by side (issue 17 targets: save and load
>= 0.8x the raw transfer while compressing and checking).

    .venv/bin/python benches/bench_object_store.py [--mb 1024] [--sweep] [--repeat 2]
        [--s3-server auto|fast|moto]

Workload: a transformer-like fp32 state of ~--mb MiB (about 200 tensors). Every variant moves
the same tensors through the same server; the best of --repeat runs is reported. --sweep also
times shardpoint saves and loads over part sizes and concurrencies (the knobs) on that state.
Finally it counts requests (through a counting proxy) for `open` of a 100,000-key checkpoint
and for one lazy `r[key]`.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

import shardpoint as sp  # noqa: E402
from s3_server import Proxy  # noqa: E402

sys.path.insert(0, str(ROOT / "benches"))
from s3server import start  # noqa: E402


def state_of(mb: int) -> dict[str, np.ndarray]:
    """~mb MiB of fp32 weights shaped like a transformer's (trained-like: normal values)."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    d = 1024
    per_layer = (4 * d * d + 2 * 4 * d * d) * 4  # attention + MLP, fp32 bytes
    layers = max(1, (mb << 20) // per_layer)
    for i in range(layers):
        for name, shape in [
            ("q", (d, d)),
            ("k", (d, d)),
            ("v", (d, d)),
            ("o", (d, d)),
            ("up", (4 * d, d)),
            ("down", (d, 4 * d)),
        ]:
            out[f"layers.{i}.{name}.weight"] = (rng.standard_normal(shape) * 0.02).astype(
                np.float32
            )
        out[f"layers.{i}.norm.weight"] = np.ones(d, np.float32)
    return out


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="state size in MiB (default 1024)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--sweep", action="store_true", help="also sweep part size x concurrency")
    ap.add_argument("--keys", type=int, default=100_000, help="keys of the request-count check")
    ap.add_argument("--s3-server", default="auto", choices=["auto", "fast", "moto"])
    args = ap.parse_args()

    import obstore
    from obstore.store import S3Store

    m = start(args.s3_server)
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": m.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
        }
    )
    bucket = m.bucket()
    raw_store = S3Store(bucket, endpoint=m.endpoint, client_options={"allow_http": True})
    state = state_of(args.mb)
    nbytes = sum(a.nbytes for a in state.values())
    gb = nbytes / 1e9
    print(f"state: {len(state)} fp32 tensors, {nbytes / 2**20:.0f} MiB; {m.kind} S3 server at "
          f"{m.endpoint}")  # fmt: skip
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")

    blob = b"".join(a.tobytes() for a in state.values())

    def raw_up() -> None:
        obstore.put(raw_store, "raw/blob", blob, chunk_size=16 << 20, max_concurrency=8)

    def raw_down() -> None:
        b = obstore.get(raw_store, "raw/blob").bytes()
        assert len(b) == nbytes

    def raw_down_ranged() -> None:
        # the request pattern of a parallel reader: 16 MiB ranged GETs, 8 in flight
        from concurrent.futures import ThreadPoolExecutor

        piece = 16 << 20
        starts = range(0, nbytes, piece)
        with ThreadPoolExecutor(8) as pool:
            got = pool.map(
                lambda a: obstore.get_range(
                    raw_store, "raw/blob", start=a, end=min(a + piece, nbytes)
                ),
                starts,
            )
            assert sum(len(g) for g in got) == nbytes

    def torch_up() -> None:
        import torch

        buf = io.BytesIO()
        torch.save({k: torch.from_numpy(v) for k, v in state.items()}, buf)
        obstore.put(raw_store, "torch/model.pt", buf.getvalue(), chunk_size=16 << 20)

    def torch_down() -> None:
        import torch

        b = obstore.get(raw_store, "torch/model.pt").bytes()
        torch.load(io.BytesIO(bytes(b)), weights_only=True)

    url_z = f"s3://{bucket}/sp/zstd"
    url_n = f"s3://{bucket}/sp/none"
    rows: list[tuple[str, float, float]] = []
    t_ru = best(raw_up, args.repeat)
    t_rd = best(raw_down, args.repeat)
    rows.append(("raw obstore put/get (same bytes)", t_ru, t_rd))
    t_rr = best(raw_down_ranged, args.repeat)
    rows.append(("raw obstore 16 MiB ranged GETs x8 (load only)", t_ru, t_rr))
    try:
        t_tu = best(torch_up, args.repeat)
        t_td = best(torch_down, args.repeat)
        rows.append(("torch.save->BytesIO->put / get->torch.load", t_tu, t_td))
    except ImportError:
        pass
    for name, url, comp in [("shardpoint zstd", url_z, "zstd"), ("shardpoint none", url_n, "none")]:
        t_su = best(lambda u=url, c=comp: sp.save_file(state, u, compression=c), args.repeat)
        t_sd = best(lambda u=url: sp.load_file(u), args.repeat)
        rows.append((name, t_su, t_sd))
    stored = sum(n for _, n in sp.open(url_z).format_info["shards"])
    print(f"\nshardpoint zstd stored {stored / 2**20:.0f} MiB (ratio {nbytes / stored:.2f})")
    print(f"\n{'variant':46s} {'save s':>8s} {'GB/s':>6s} {'load s':>8s} {'GB/s':>6s} "
          f"{'save x raw':>10s} {'load x raw':>10s}")  # fmt: skip
    for name, up, down in rows:
        print(
            f"{name:46s} {up:8.2f} {gb / up:6.2f} {down:8.2f} {gb / down:6.2f} "
            f"{t_ru / up:10.2f} {t_rd / down:10.2f}"
        )

    if args.sweep:
        print("\nknobs (shardpoint zstd; storage_options part_size / concurrency):")
        print(f"{'part MiB':>8s} {'conc':>5s} {'save GB/s':>10s} {'load GB/s':>10s}")
        for part in (8, 16, 32):
            for conc in (4, 8, 16):
                o = {"part_size": str(part << 20), "concurrency": str(conc)}
                u = f"s3://{bucket}/sweep/{part}-{conc}"
                su = best(lambda u=u, o=o: sp.save_file(state, u, storage_options=o), 1)
                sd = best(lambda u=u, o=o: sp.load_file(u, storage_options=o), 1)
                print(f"{part:8d} {conc:5d} {gb / su:10.2f} {gb / sd:10.2f}")

    # requests per open and per lazy read, through a counting proxy
    proxy = Proxy(m.port)
    many = f"s3://{bucket}/many/{uuid.uuid4().hex[:6]}"
    sp.save_file({f"k{i:06d}": np.full(4, i, np.int32) for i in range(args.keys)}, many)
    opts = {"endpoint": proxy.endpoint, "allow_http": "true"}
    proxy.reset()
    r = sp.open(many, storage_options=opts)
    n_open = len(proxy.requests())
    proxy.reset()
    r[f"k{args.keys // 2:06d}"]
    n_get = len(proxy.requests())
    print(f"\nrequests: open of a {args.keys}-key checkpoint = {n_open}; one lazy r[key] = {n_get}")
    proxy.close()
    m.close()


if __name__ == "__main__":
    main()
