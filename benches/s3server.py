"""The benchmarks' S3 server: ``benches/s3server`` (ours, Rust, on the ``s3s`` protocol library)
built on demand and started in its own process over a temporary directory, so that what a bench
measures is the client and the link, not the server (moto's Python server tops out at
0.01-0.05 GB/s here, s3s-fs at 0.1-0.16 GB/s; docs/SERVING.md). moto stays the fallback
where cargo is missing, and the protocol tests in tests/ keep using moto (building this server
takes minutes: ``make test`` never does).

    from s3server import s3_server, s3_environment
    with s3_server("auto") as s3:          # "fast" (ours, or fail), "moto", "auto"
        bucket = s3.bucket()               # s3.endpoint, s3.port, s3.s3 (a boto3 client)

    python benches/s3server.py [--kind fast]   # build, start, print the endpoint, wait

The build: ``cargo build --release --locked --manifest-path benches/s3server/Cargo.toml`` with
``CARGO_TARGET_DIR`` = ``$SP_S3SERVER_TARGET`` or ``~/.cache/shardpoint/s3server-target``
(a no-op of about a second once built).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "s3server" / "Cargo.toml"
KEY = SECRET = "testing"  # the tests' and benches' credentials (both servers accept them)

sys.path.insert(0, str(HERE.parent / "tests"))
from s3_server import aws_environment  # noqa: E402  (the tests' helpers, one copy)


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1, for a server started on it next (moto's
    command line; s3s-fs in bench_s3server.py). Fine for benches, which run one at a time;
    the tests let their servers bind port 0 instead (tests/s3_server.py: under xdist another
    worker can take a port between this probe and the server's bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def target_dir() -> Path:
    default = "~/.cache/shardpoint/s3server-target"
    return Path(os.environ.get("SP_S3SERVER_TARGET", default)).expanduser()


def build(quiet: bool = False) -> Path | None:
    """The server's binary, built (or brought up to date) first; None where cargo is missing.
    A failed build raises (with cargo's output): a broken server must not silently become
    moto."""
    cargo = shutil.which("cargo")
    if cargo is None:
        return None
    cmd = [cargo, "build", "--release", "--locked", "--manifest-path", str(MANIFEST)]
    env = {**os.environ, "CARGO_TARGET_DIR": str(target_dir())}
    if not quiet:
        print("building the S3 server (minutes the first time):", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building {MANIFEST} failed:\n{r.stderr[-4000:]}")
    return target_dir() / "release" / "sp-s3server"


class Server:
    """A running S3 server in its own process and a boto3 client on it. The surface of
    tests/s3_server.Moto (``port``, ``endpoint``, ``s3``, ``bucket()``, ``keys()``,
    ``uploads()``), plus ``kind`` ("fast" or "moto") and ``close()``.

    Ours also delays and counts requests itself, with the surface the benches use of
    tests/s3_server.Proxy (``latency``, ``reset()``, ``counts()``): thousands of requests a
    second, which the Python proxy could not forward (``has_control``)."""

    control_port: int | None = None

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.root = Path(tempfile.mkdtemp(prefix=f"sp-s3-{kind}-"))
        if kind == "fast":
            binary = build()
            if binary is None:
                raise RuntimeError("the fast S3 server needs cargo (not found on PATH)")
            cmd = [str(binary), "--root", str(self.root), "--port", "0",
                   "--access-key", KEY, "--secret-key", SECRET]  # fmt: skip
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.port = self._announced_port()
            self.control_port = self._announced_control()
            self._control = socket.create_connection(("127.0.0.1", self.control_port))
            self._control_in = self._control.makefile("r")
            self._latency = 0.0
        elif kind == "moto":
            self.port = free_port()
            cmd = [sys.executable, "-m", "moto.server", "-p", str(self.port)]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            raise ValueError(f"unknown S3 server kind {kind!r} (fast, moto)")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._wait_ready()
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY,
                               aws_secret_access_key=SECRET, region_name="us-east-1")  # fmt: skip

    def _announced_port(self) -> int:
        """The port from the server's ``listening on http://HOST:PORT`` line."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening on http://"):
            self.close()
            raise RuntimeError(f"the S3 server did not start (said {line!r})")
        return int(line.strip().rsplit(":", 1)[1])

    def _announced_control(self) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("control on "):
            self.close()
            raise RuntimeError(f"the S3 server did not announce its control port ({line!r})")
        return int(line.strip().rsplit(":", 1)[1])

    @property
    def has_control(self) -> bool:
        return self.control_port is not None

    def _command(self, line: str) -> str:
        if self.control_port is None:
            raise RuntimeError(f"the {self.kind} S3 server has no control port")
        self._control.sendall(line.encode() + b"\n")
        out = self._control_in.readline().strip()
        if out.startswith("error"):
            raise ValueError(f"S3 server control {line!r}: {out}")
        return out

    @property
    def latency(self) -> float:
        """Seconds the server waits before answering each request."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self._command(f"latency {seconds!r}")
        self._latency = seconds

    def reset(self) -> None:
        """Start counting requests from zero."""
        self._command("reset")

    def counts(self) -> dict[str, int]:
        """Requests since the last reset, by S3 operation (tests/s3_server.request_kind's names;
        also COPY and BUCKET)."""
        return {str(k): int(v) for k, v in json.loads(self._command("counts")).items()}

    def _wait_ready(self) -> None:
        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.kind} S3 server exited ({self.proc.returncode})")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError(f"the {self.kind} S3 server does not answer on {self.port}")

    def bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.s3.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", []))

    def uploads(self, bucket: str) -> list[str]:
        """Incomplete multipart uploads in the bucket (keys)."""
        return [u["Key"] for u in self.s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]

    def upload_tree(self, local: Path, bucket: str) -> None:
        """Every file under ``local`` as an object of ``bucket`` (key: the relative path)."""
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            self.s3.upload_file(str(f), bucket, f.relative_to(local).as_posix())

    def close(self) -> None:
        if self.control_port is not None:
            self._control_in.close()
            self._control.close()
            self.control_port = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.root, ignore_errors=True)


def start(kind: str = "auto") -> Server:
    """``fast``: ours (raises without cargo); ``moto``; ``auto``: ours where cargo is found,
    else moto (said on stderr: the figures then measure moto)."""
    if kind == "auto":
        if shutil.which("cargo") is None:
            print("cargo not found: the benchmark's S3 server is moto (slow)", file=sys.stderr)
            kind = "moto"
        else:
            kind = "fast"
    return Server(kind)


@contextlib.contextmanager
def s3_server(kind: str = "auto") -> Iterator[Server]:
    s = start(kind)
    try:
        yield s
    finally:
        s.close()


@contextlib.contextmanager
def s3_environment(kind: str = "auto") -> Iterator[Server]:
    """A started server with the AWS_* variables that point the core's object-store client
    (and boto3) at it, put back as they were (and the server stopped) after."""
    with s3_server(kind) as s, aws_environment(s.endpoint, KEY, SECRET):
        yield s


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="fast", choices=["fast", "moto", "auto"])
    args = ap.parse_args()
    with s3_server(args.kind) as s:
        print(f"{s.kind} S3 server at {s.endpoint} (key/secret {KEY}/{SECRET}); Ctrl-C stops")
        with contextlib.suppress(KeyboardInterrupt):
            while s.proc.poll() is None:
                time.sleep(1)


if __name__ == "__main__":
    main()
