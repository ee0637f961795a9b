"""The counting, latency-adding proxy of tests/s3_server.py in a process of its own.

In the bench's own process the proxy's Python threads (one per request, GIL-bound) compete
with the code being measured and their CPU counts as the coordinator's: at N = 4,096 the
merge's 4,097 GETs cost the proxy more CPU than the merge itself (docs/SCALE.md). Here the
bench keeps the same handle (``port``, ``endpoint``, ``latency``, ``reset()``, ``counts()``,
``requests()``, ``close()``); each call is one message over a pipe.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

TESTS = str(Path(__file__).resolve().parents[1] / "tests")


def _serve(conn: Connection, backend_port: int, rate: float | None) -> None:
    sys.path.insert(0, TESTS)
    from s3_server import Proxy

    proxy = Proxy(backend_port, rate_bytes_per_s=rate)
    conn.send(proxy.port)
    while True:
        op, arg = conn.recv()
        if op == "close":
            proxy.close()
            conn.send(None)
            return
        if op == "latency":
            proxy.latency = float(arg)
            conn.send(None)
        elif op == "reset":
            proxy.reset()
            conn.send(None)
        elif op == "counts":
            conn.send(proxy.counts())
        elif op == "requests":
            conn.send(proxy.requests(arg))
        elif op == "got":
            conn.send(list(proxy.got))
        elif op == "per_prefix_rate":
            proxy.per_prefix_rate(*arg)
            conn.send(None)
        elif op == "slowdowns":
            with proxy.lock:
                conn.send((dict(proxy.slowdowns), dict(proxy.prefix_requests)))
        else:
            conn.send(ValueError(f"unknown proxy operation {op!r}"))


class ProxyProcess:
    """tests/s3_server.Proxy (forwarding to ``backend_port``) run in a spawned process."""

    def __init__(self, backend_port: int, rate_bytes_per_s: float | None = None) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process that may run the core's threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, backend_port, rate_bytes_per_s), daemon=True
        )
        self._proc.start()
        child.close()
        if not self._conn.poll(60):
            self._proc.kill()
            raise RuntimeError("the proxy process did not start")
        self.port = int(self._conn.recv())
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._latency = 0.0

    def _call(self, op: str, arg: Any = None) -> Any:
        self._conn.send((op, arg))
        out = self._conn.recv()
        if isinstance(out, BaseException):
            raise out
        return out

    @property
    def latency(self) -> float:
        """Seconds added to every request."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self._call("latency", seconds)
        self._latency = seconds

    def reset(self) -> None:
        self._call("reset")

    def counts(self) -> dict[str, int]:
        """Requests since the last reset, by S3 operation (tests/s3_server.request_kind)."""
        return dict(self._call("counts"))

    def requests(self, method: str | None = None) -> list[tuple[str, str, str | None]]:
        return list(self._call("requests", method))

    @property
    def got(self) -> list[tuple[str, int]]:
        """(path, body bytes) of every GET answered since the last reset, as the in-process
        proxy keeps them (the load harness sums the bytes per loading rank)."""
        return list(self._call("got"))

    def per_prefix_rate(self, rate: float | None, burst: float = 1.0) -> None:
        """Throttle per key prefix (tests/s3_server.Proxy.per_prefix_rate)."""
        self._call("per_prefix_rate", (rate, burst))

    def slowdowns(self) -> tuple[dict[str, int], dict[str, int]]:
        """The 503s answered and the requests seen since ``per_prefix_rate``, by prefix."""
        got = self._call("slowdowns")
        return dict(got[0]), dict(got[1])

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("close")
            except (EOFError, OSError):
                pass
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
