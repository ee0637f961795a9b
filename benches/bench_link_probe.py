"""Where a remote load's time goes: ``weights_iterator`` (no model, no copy) over the
benchmarks' S3 server, straight and through bench_serving's rate-limited relay, with the
iterator's remote read scheduling varied in one process (reads in flight, batch size, decode
threads), interleaved so that the rows of one round saw the same machine.

    .venv/bin/python benches/bench_link_probe.py [--data bench-out/serving/data]
        [--names sp_none,sp_default] [--modes direct,link] [--depths 1,2] [--batches-mib 32,64]
        [--threads 0] [--rounds 2] [--link-mbps 150]

``--data``: bench_serving.py's checkpoints (run it once first). ``--threads 0``: the default.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))

import bench_serving as bs  # noqa: E402
import shardpoint.torch as spt  # noqa: E402
import shardpoint.torch.weights as weights  # noqa: E402
from s3server import KEY, SECRET, Server  # noqa: E402


def rate(url: str, endpoint: str, threads: int | None) -> tuple[float, float]:
    """GB/s of raw tensor bytes, and the process's CPU seconds, of one full iteration."""
    opts = {"endpoint": endpoint, "aws_access_key_id": KEY, "aws_secret_access_key": SECRET,
            "region": "us-east-1", "allow_http": "true"}  # fmt: skip
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for _, v in spt.weights_iterator(url, io="pread", storage_options=opts, threads=threads):
        n += v.numel() * v.element_size()
    return n / (time.perf_counter() - t0) / 1e9, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("bench-out/serving/data"))
    ap.add_argument("--names", default="sp_none,sp_default")
    ap.add_argument("--modes", default="direct,link")
    ap.add_argument("--depths", default="1,2")
    ap.add_argument("--batches-mib", default="32,64")
    ap.add_argument("--threads", default="0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--link-mbps", type=float, default=150.0)
    args = ap.parse_args()
    names = args.names.split(",")
    s = Server("fast")
    relay = None
    try:
        s.s3.create_bucket(Bucket="bench")
        for f in sorted(args.data.iterdir()):
            if any(f.name.startswith(n + ".") for n in names):
                s.s3.upload_file(str(f), "bench", f.name)
        relay_port, relay = bs.throttled(s.port, args.link_mbps * 1e6)
        endpoints = {"direct": s.endpoint, "link": f"http://127.0.0.1:{relay_port}"}
        for rnd in range(args.rounds):
            for name in names:
                for mode in args.modes.split(","):
                    for depth in map(int, args.depths.split(",")):
                        for mib in map(int, args.batches_mib.split(",")):
                            for t in map(int, args.threads.split(",")):
                                weights._REMOTE_DEPTH = depth
                                weights._REMOTE_BATCH = mib << 20
                                got, cpu = rate(f"s3://bench/{name}", endpoints[mode], t or None)
                                print(f"round {rnd + 1} {name:10s} {mode:6s} depth {depth} "
                                      f"batch {mib:3d} MiB threads {t or 'default'}: {got:.3f} "
                                      f"GB/s, {cpu:.2f} s CPU, load {os.getloadavg()[0]:.1f}",
                                      flush=True)  # fmt: skip
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(10)
        s.close()


if __name__ == "__main__":
    main()
