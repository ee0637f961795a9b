"""Is the S3 server the bottleneck? GET rates of one ~1 GB object from each server the benches
can use, to curl (SigV4, one stream), boto3 (one GET; ``download_fileobj`` with 8 threads) and
shardpoint's own reader (``sp.load_file`` of a 1 GB uncompressed checkpoint: ranged GETs in
flight), side by side in one run.

    .venv/bin/python benches/bench_s3server.py [--mb 1000] [--rounds 2]
        [--servers fast,moto,s3s-fs] [--s3s-fs ~/.cache/shardpoint/s3s-fs/bin/s3s-fs]

``fast``: benches/s3server (ours, built on demand); ``moto``: moto's server in its own process;
``s3s-fs``: the s3s project's file-system server where its binary is given (``cargo install
s3s-fs --version 0.14.1 --features binary --locked --root ~/.cache/shardpoint/s3s-fs``).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))

import shardpoint as sp  # noqa: E402
from s3server import KEY, SECRET, Server, free_port  # noqa: E402

GB = 1e9


class S3sFs(Server):
    """s3s-fs (the s3s project's example server) over a temporary directory."""

    def __init__(self, binary: str) -> None:
        self.kind = "s3s-fs"
        self.root = Path(tempfile.mkdtemp(prefix="sp-s3-s3sfs-"))
        self.port = free_port()
        cmd = [binary, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", KEY,
               "--secret-key", SECRET, str(self.root)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._wait_ready()
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY,
                               aws_secret_access_key=SECRET, region_name="us-east-1")  # fmt: skip


def curl_get(endpoint: str, bucket: str, key: str) -> int:
    out = subprocess.run(
        ["curl", "-sf", "-o", "/dev/null", "-w", "%{size_download}",
         "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",  # curl 7.88 does not send it
         "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{KEY}:{SECRET}",
         f"{endpoint}/{bucket}/{key}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout)


def timed(fn: Callable[[], int]) -> float:
    t0 = time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t0
    return n / dt / GB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default="fast,moto,s3s-fs")
    ap.add_argument("--s3s-fs", default=str(Path("~/.cache/shardpoint/s3s-fs/bin/s3s-fs")))
    args = ap.parse_args()
    from boto3.s3.transfer import TransferConfig

    n = args.mb * 1_000_000 // 4
    rng = np.random.default_rng(0)
    state = {f"t{i:02d}": rng.standard_normal(n // 50).astype(np.float32) for i in range(50)}
    blob = b"".join(a.tobytes() for a in state.values())
    nbytes = len(blob)
    servers: dict[str, Server] = {}
    rows: dict[tuple[str, str], list[float]] = {}
    try:
        for kind in args.servers.split(","):
            if kind == "s3s-fs":
                binary = os.path.expanduser(args.s3s_fs)
                if not os.path.exists(binary):
                    print(f"s3s-fs: no binary at {binary}, skipped")
                    continue
                servers[kind] = S3sFs(binary)
            else:
                servers[kind] = Server(kind)
            s = servers[kind]
            s.s3.create_bucket(Bucket="bench")
            t0 = time.perf_counter()
            s.s3.upload_fileobj(io.BytesIO(blob), "bench", "blob")
            up = time.perf_counter() - t0
            opts = {"endpoint": s.endpoint, "allow_http": "true", "aws_access_key_id": KEY,
                    "aws_secret_access_key": SECRET, "region": "us-east-1"}  # fmt: skip
            t0 = time.perf_counter()
            sp.save_file(state, "s3://bench/sp-none", compression="none", storage_options=opts)
            save = time.perf_counter() - t0
            print(f"{kind}: boto3 upload {nbytes / up / GB:.2f} GB/s, shardpoint save "
                  f"{nbytes / save / GB:.2f} GB/s", flush=True)  # fmt: skip
        cfg = TransferConfig(max_concurrency=8, multipart_chunksize=16 << 20)
        for rnd in range(args.rounds):
            for kind, s in servers.items():
                opts = {"endpoint": s.endpoint, "allow_http": "true", "aws_access_key_id": KEY,
                        "aws_secret_access_key": SECRET, "region": "us-east-1"}  # fmt: skip

                def boto_one(s: Server = s) -> int:
                    return len(s.s3.get_object(Bucket="bench", Key="blob")["Body"].read())

                def boto_par(s: Server = s) -> int:
                    buf = io.BytesIO()
                    s.s3.download_fileobj("bench", "blob", buf, Config=cfg)
                    return len(buf.getvalue())

                def ours(opts: dict[str, str] = opts) -> int:
                    got = sp.load_file("s3://bench/sp-none", storage_options=opts)
                    return sum(a.nbytes for a in got.values())

                cases = {"curl": lambda s=s: curl_get(s.endpoint, "bench", "blob"),
                         "boto3 get": boto_one, "boto3 x8": boto_par,
                         "sp.load_file": ours}  # fmt: skip
                for client, fn in cases.items():
                    r = timed(fn)
                    rows.setdefault((kind, client), []).append(r)
                    print(f"  round {rnd + 1} {kind:7s} {client:13s} {r:.2f} GB/s", flush=True)
    finally:
        for s in servers.values():
            s.close()
    print(f"\n{nbytes / 1e6:.0f} MB object, GB/s best (median) of {args.rounds}, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    clients = ["curl", "boto3 get", "boto3 x8", "sp.load_file"]
    print(f"{'server':8s} " + " ".join(f"{c:>14s}" for c in clients))
    for kind in servers:
        cells = []
        for c in clients:
            v = rows.get((kind, c), [])
            cells.append(f"{max(v):6.2f} ({statistics.median(v):.2f})" if v else "-")
        print(f"{kind:8s} " + " ".join(f"{x:>14s}" for x in cells))


if __name__ == "__main__":
    if not shutil.which("curl"):
        raise SystemExit("curl is needed")
    main()
