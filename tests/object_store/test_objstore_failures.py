"""Failures and request counts against a real S3 server (moto): a writer killed mid-upload,
throttling and dropped connections (retried), a server gone mid-read or hanging (clear error,
bounded time), and how many requests open and lazy reads cost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shardpoint as sp
from s3_server import Moto, Proxy, opts_for
from shardpoint.cli import main as cli
from shardpoint.errors import CheckpointIOError

_WRITER = textwrap.dedent(
    """
    import sys, numpy as np, shardpoint as sp
    w = sp.Writer(sys.argv[1], compression="none",
                  storage_options={"part_size": str(5 << 20), "concurrency": "1"})
    i = 0
    while True:  # until killed: every add sends parts of a multipart upload
        w.add(f"t{i}", np.random.default_rng(i).standard_normal(3 << 20).astype(np.float32))
        i += 1
        print("added", i, flush=True)
    """
)


def _kill_mid_upload(moto: Moto, bucket: str, url: str) -> None:
    env = dict(os.environ)
    p = subprocess.Popen(
        [sys.executable, "-c", _WRITER, url], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("added")  # at least one part is up
        deadline = time.monotonic() + 30
        while not moto.uploads(bucket) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert moto.uploads(bucket), "the killed writer left no multipart upload to clean"
    # no marker: gc finds the upload with ListMultipartUploads (docs/OBJECT_STORE.md)
    assert not any(k.endswith(".upload") for k in moto.keys(bucket))


def test_killed_writer_next_save_succeeds_and_gc_cleans_up(moto, bucket: str) -> None:
    """A save never lists (docs/SCALE.md): the next save succeeds beside the killed writer's
    leftovers, and `gc` (which lists, objects and multipart uploads) aborts its upload."""
    url = f"s3://{bucket}/kill/ckpt"
    sp.save_file({"v": np.arange(8)}, url)
    _kill_mid_upload(moto, bucket, url)
    np.testing.assert_array_equal(sp.load_file(url)["v"], np.arange(8))  # previous intact
    sp.save_file({"v": np.arange(9)}, url)
    np.testing.assert_array_equal(sp.load_file(url)["v"], np.arange(9))
    assert moto.uploads(bucket), "a save aborts nobody else's upload"
    assert cli(["gc", f"s3://{bucket}/kill", "--older-than", "0"]) == 0
    assert moto.uploads(bucket) == []
    keys = moto.keys(bucket)
    assert not any(k.endswith(".upload") for k in keys), keys
    assert sum(".data-" in k for k in keys) == 1, keys
    np.testing.assert_array_equal(sp.load_file(url)["v"], np.arange(9))


def test_killed_writer_gc_cleans_up(moto, bucket: str) -> None:
    url = f"s3://{bucket}/gc/ckpt"
    sp.save_file({"v": np.arange(8)}, url)
    _kill_mid_upload(moto, bucket, url)
    assert cli(["gc", f"s3://{bucket}/gc", "--older-than", "3600"]) == 0
    assert moto.uploads(bucket), "a recent upload (maybe live) is spared by --older-than"
    assert cli(["gc", f"s3://{bucket}/gc", "--older-than", "0"]) == 0
    assert moto.uploads(bucket) == []
    assert not any(k.endswith(".upload") for k in moto.keys(bucket))
    np.testing.assert_array_equal(sp.load_file(url)["v"], np.arange(8))


@pytest.mark.parametrize("mode", ["503", "drop"])
def test_transient_failures_are_retried(moto, bucket: str, proxy: Proxy, mode: str) -> None:
    url = f"s3://{bucket}/flaky/ckpt"
    opts = opts_for(proxy)
    vals = {"w": np.arange(1000, dtype=np.float32), "s": "text"}
    proxy.fail_next(3, mode)
    sp.save_file(vals, url, storage_options=opts)
    proxy.fail_next(3, mode)
    got = sp.load_file(url, storage_options=opts)
    np.testing.assert_array_equal(got["w"], vals["w"])
    assert got["s"] == "text"
    assert len(proxy.requests()) > 6  # the failures were answered by the proxy, then retried


def test_server_gone_mid_read_is_clear_error(moto: Moto) -> None:
    """A dedicated server, stopped after open: the read fails with CheckpointIOError naming
    the URL after bounded retries, within seconds."""
    m = Moto()
    try:
        b = m.bucket()
        opts = {
            "endpoint": m.endpoint,
            "allow_http": "true",
            "max_retries": "2",
            "retry_timeout": "5",
        }
        url = f"s3://{b}/gone/ckpt"
        sp.save_file({"x": np.arange(100)}, url, storage_options=opts)
        r = sp.open(url, storage_options=opts)
    finally:
        m.server.stop()
    t0 = time.monotonic()
    with pytest.raises(CheckpointIOError, match=f"s3://{b}/gone/ckpt.data-"):
        r["x"]
    assert time.monotonic() - t0 < 30


def test_hanging_server_times_out(moto: Moto) -> None:
    """A server that accepts connections and never answers: the request timeout ends it."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)  # never answered

    threading.Thread(target=accept, daemon=True).start()
    port = srv.getsockname()[1]
    opts = {
        "endpoint": f"http://127.0.0.1:{port}",
        "allow_http": "true",
        "timeout": "1s",
        "max_retries": "1",
        "retry_timeout": "3",
    }
    t0 = time.monotonic()
    try:
        with pytest.raises(CheckpointIOError, match="s3://hang/x/ckpt.index"):
            sp.open("s3://hang/x/ckpt", storage_options=opts)
    finally:
        srv.close()
        for c in conns:
            c.close()
    assert time.monotonic() - t0 < 20


def test_request_counts_open_and_lazy_read(moto, bucket: str, proxy: Proxy) -> None:
    url = f"s3://{bucket}/count/ckpt"
    n = 100_000
    vals: dict[str, object] = {f"k{i:06d}": np.full(4, i, dtype=np.int32) for i in range(n)}
    vals["big"] = np.arange(1 << 20, dtype=np.float32)  # 4 MiB, compressed in 64 KiB chunks
    sp.save_file(vals, url, compression="zstd", chunk_bytes=64 << 10)
    opts = opts_for(proxy)
    proxy.reset()
    r = sp.open(url, storage_options=opts)
    gets = proxy.requests("GET")
    assert len(proxy.requests()) == len(gets) <= 2, proxy.requests()
    assert len(r) == n + 1
    proxy.reset()
    info = r.info("k054321")
    assert info.codec == "none"
    np.testing.assert_array_equal(r["k054321"], np.full(4, 54321, dtype=np.int32))
    reqs = proxy.requests()
    assert len(reqs) == 1 and reqs[0][0] == "GET", reqs
    lo = info.offset
    assert reqs[0][2] == f"bytes={lo}-{lo + info.stored_bytes - 1}"
    # a slice of a compressed tensor fetches only the chunks holding the rows: one small GET
    proxy.reset()
    np.testing.assert_array_equal(
        r.slice("big", 1000, 1010), np.arange(1000, 1010, dtype=np.float32)
    )
    reqs = proxy.requests()
    assert len(reqs) == 1
    a, b = (int(x) for x in reqs[0][2].removeprefix("bytes=").split("-"))
    assert b - a + 1 <= 64 << 10
    # many values in one load: coalesced, far fewer GETs than values
    proxy.reset()
    some = [f"k{i:06d}" for i in range(0, 2000)]
    got = sp.load_file(url, keys=some, storage_options=opts)
    assert len(got) == 2000
    assert len(proxy.requests("GET")) <= 2, len(proxy.requests())
