"""Test helpers for the object-store tests: a moto S3 server (real HTTP) and a forwarding
proxy that counts requests and injects failures."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import http.client
import os
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
from moto.server import ThreadedMotoServer


class Moto:
    """A running moto server and a boto3 client for checking what is in the buckets."""

    def __init__(self) -> None:
        # Port 0: the server binds whatever port is free and keeps it. A port picked free
        # here and bound by the server later could be taken in between by another xdist
        # worker's server or connection, and then moto's server thread dies on the bind
        # while ``start()`` waits forever for it to be ready.
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.port = int(self.server.get_host_and_port()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.s3.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every key in the bucket (all pages: a listing answers at most 1,000)."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def uploads(self, bucket: str) -> list[str]:
        """Incomplete multipart uploads in the bucket (keys)."""
        return [u["Key"] for u in self.s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def request_kind(method: str, path: str) -> str:
    """The S3 operation of a request, from its method and query: ``PUT``, ``GET``, ``HEAD``,
    ``LIST`` (objects, multipart uploads or an upload's parts), ``DELETE``, ``BULK_DELETE`` (DeleteObjects),
    ``MP_CREATE``, ``MP_PART``, ``MP_COMPLETE``, ``MP_ABORT``."""
    query = path.partition("?")[2]
    args = {a.partition("=")[0] for a in query.split("&") if a}
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        bucket_level = path.partition("?")[0].strip("/").count("/") == 0
        listing = "uploads" in args or "uploadId" in args or "list-type" in args
        return "LIST" if listing or bucket_level else "GET"
    if method == "PUT":
        return "MP_PART" if "partNumber" in args else "PUT"
    if method == "POST":
        if "uploads" in args:
            return "MP_CREATE"
        if "delete" in args:
            return "BULK_DELETE"
        return "MP_COMPLETE" if "uploadId" in args else "POST"
    if method == "DELETE":
        return "MP_ABORT" if "uploadId" in args else "DELETE"
    return method


class Proxy:
    """HTTP forwarder in front of moto: counts requests (`counts()`: by S3 operation, see
    `request_kind`); `latency` seconds are added to every request (a far-away store);
    ``rate_bytes_per_s``: a rate-limited link shared by every connection;
    `fail_next(n, mode)` makes the next n
    requests fail with a 503 ("503"), a 403 that is not retried ("403") or a dropped connection
    ("drop"), `fail_after(n, mode)` the one after the next n; `flip_ranged_get(n, bit)`
    flips one bit of the n-th ranged GET's response body (bytes damaged in transit);
    `clock_skew` (seconds): the store's clock runs that far from this machine's: every time
    the store answers with (the `Date` and `Last-Modified` headers, `LastModified` and
    `Initiated` in listings) is shifted by it; `send_date = False`: answers carry no `Date`
    (as from a store whose responses do not say its time); `per_prefix_rate(rate, burst)`:
    S3's partitioning, requests per second per key prefix above a rate answered
    `503 SlowDown` (`slowdowns` counts them by prefix)."""

    def __init__(self, backend_port: int, rate_bytes_per_s: float | None = None) -> None:
        self.backend_port = backend_port
        # a link of this many bytes per second, shared by every connection (None: unlimited):
        # each body chunk waits for its slot on the link before it is sent
        self.rate = rate_bytes_per_s
        self._link_free = 0.0
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        # response body bytes of every GET answered from the backend: (path, bytes)
        self.got: list[tuple[str, int]] = []
        self.fail: list[str] = []
        # transit damage: flip bit `flip[1]` of the body of ranged GET number `flip[0]`
        # (counted from the last reset); `flipped` records (path, Range, byte) when it happened
        self.flip: tuple[int, int] | None = None
        self.ranged_gets = 0
        self.flipped: list[tuple[str, str, int]] = []
        # a store that answers ranged GETs wrongly (range_fault): the mode, and the ranged GETs
        # it was applied to as (path, Range)
        self.range_mode: str | None = None
        self.range_faulted: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.latency = 0.0
        # random faults (random_faults): mode -> probability, and how many were injected
        self.rates: dict[str, float] = {}
        self.rng = random.Random(0)
        self.injected: dict[str, int] = {}
        self.faults: list[tuple[str, str, str]] = []  # (mode, method, path) of failed requests
        # requests being answered now, and the most at once since the last reset
        self.inflight = 0
        self.max_inflight = 0
        self.clock_skew = 0.0
        self.send_date = True
        # per-prefix throttling (per_prefix_rate): rate, burst, and per prefix the tokens left
        # and when they were counted; 503s answered and requests seen, by prefix
        self.prefix_limit: tuple[float, float] | None = None
        self._buckets: dict[str, tuple[float, float]] = {}
        self.slowdowns: dict[str, int] = {}
        self.prefix_requests: dict[str, int] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def date_time_string(self, timestamp: float | None = None) -> str:
                # the `Date` of every answer: the store's clock
                t = time.time() if timestamp is None else timestamp
                return email.utils.formatdate(t + proxy.clock_skew, usegmt=True)

            def send_header(self, keyword: str, value: str) -> None:
                if proxy.send_date or keyword.lower() != "date":
                    super().send_header(keyword, value)

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                proxy.throttle(n)
                with proxy.lock:
                    proxy.log.append((self.command, self.path, self.headers.get("Range")))
                    mode = proxy.fail.pop(0) if proxy.fail else proxy._random_mode()
                    if mode is None:
                        mode = proxy._throttled(self.path)
                    if mode is not None and mode != "pass":
                        proxy.faults.append((mode, self.command, self.path))
                    latency = proxy.latency
                    proxy.inflight += 1
                    proxy.max_inflight = max(proxy.max_inflight, proxy.inflight)
                try:
                    if latency:
                        time.sleep(latency)
                    self._answer(mode, body)
                finally:
                    with proxy.lock:
                        proxy.inflight -= 1

            def _answer(self, mode: str | None, body: bytes | None) -> None:
                if mode == "403":  # not retried: the request fails for good
                    msg = b"<Error><Code>AccessDenied</Code></Error>"
                    self.send_response(403)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if mode == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode == "503":
                    msg = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                c = http.client.HTTPConnection("127.0.0.1", proxy.backend_port, timeout=30)
                headers = {k: v for k, v in self.headers.items()}
                rng = self.headers.get("Range")
                with proxy.lock:
                    range_mode = proxy.range_mode if self.command == "GET" and rng else None
                    if range_mode is not None:
                        proxy.range_faulted.append((self.path, rng or ""))
                if range_mode == "full":  # the Range header ignored: 200 and the whole object
                    headers = {k: v for k, v in headers.items() if k.lower() != "range"}
                elif range_mode == "shift" and rng:  # another range, said so in Content-Range
                    lo, _, hi = rng.split("=", 1)[1].partition("-")
                    headers = {k: v for k, v in headers.items() if k.lower() != "range"}
                    headers["Range"] = f"bytes={int(lo) + 1}-{int(hi) + 1 if hi else ''}"
                c.request(self.command, self.path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                if range_mode == "short" and r.status == 206:
                    data = data[:-1]  # a body shorter than its Content-Range says
                elif range_mode == "long" and r.status == 206:
                    data = data + b"\0"  # a body longer than its Content-Range says
                if self.command == "GET" and rng and r.status == 206:
                    with proxy.lock:
                        nth, proxy.ranged_gets = proxy.ranged_gets, proxy.ranged_gets + 1
                        flip = proxy.flip
                        if flip is not None and flip[0] == nth and data:
                            bit = flip[1] % (8 * len(data))
                            body = bytearray(data)
                            body[bit // 8] ^= 1 << (bit % 8)
                            data = bytes(body)
                            proxy.flipped.append((self.path, rng, bit // 8))
                if self.command == "GET":
                    with proxy.lock:
                        proxy.got.append((self.path, len(data)))
                skew = proxy.clock_skew
                if skew and r.getheader("Content-Type", "").endswith("xml"):
                    data = _shift_xml_times(data, skew)
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        if skew and k.lower() == "date":
                            continue  # this proxy's own `Date` (date_time_string) says it
                        if skew and k.lower() == "last-modified":
                            t = email.utils.parsedate_to_datetime(v).timestamp() + skew
                            v = email.utils.formatdate(t, usegmt=True)
                        self.send_header(k, v)
                # a HEAD has no body: its Content-Length is the object's, as the store said
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        for i in range(0, len(data), 1 << 16):
                            proxy.throttle(min(1 << 16, len(data) - i))
                            self.wfile.write(data[i : i + (1 << 16)])
                    except (BrokenPipeError, ConnectionResetError):
                        # a client that stopped reading (it refused a wrong answer): done
                        self.close_connection = True
                c.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        class Server(ThreadingHTTPServer):
            # many clients connect at once (a merge reads 64 objects in flight): the default
            # backlog of 5 drops their SYNs and the kernel retries them a second later
            request_queue_size = 1024

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def throttle(self, nbytes: int) -> None:
        """Wait for ``nbytes`` worth of time on the shared rate-limited link."""
        if self.rate is None or nbytes <= 0:
            return
        with self.lock:
            start = max(time.monotonic(), self._link_free)
            self._link_free = start + nbytes / self.rate
            until = self._link_free
        delay = until - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def reset(self) -> None:
        with self.lock:
            self.log.clear()
            self.got.clear()
            self.max_inflight = self.inflight
            self.ranged_gets = 0
            self.flipped.clear()

    def flip_ranged_get(self, nth: int | None, bit: int = 0) -> None:
        """Damage ranged GET number ``nth`` from now (0-based): flip bit ``bit`` (modulo the
        body's bits) of its response body; ``None`` stops flipping."""
        with self.lock:
            self.ranged_gets = 0
            self.flipped.clear()
            self.flip = None if nth is None else (nth, bit)

    def range_fault(self, mode: str | None) -> None:
        """Answer every ranged GET from now wrongly: ``"full"`` (the Range ignored: 200 with
        the whole object), ``"shift"`` (206 with the range one byte further on, which its
        Content-Range says), ``"short"`` / ``"long"`` (206 whose body is one byte shorter /
        longer than its Content-Range says); None stops. ``range_faulted`` lists them."""
        with self.lock:
            self.range_mode = mode
            self.range_faulted.clear()

    def requests(self, method: str | None = None) -> list[tuple[str, str, str | None]]:
        with self.lock:
            return [r for r in self.log if method is None or r[0] == method]

    def counts(self) -> dict[str, int]:
        """Requests since the last reset, by S3 operation (`request_kind`)."""
        out: dict[str, int] = {}
        for method, path, _ in self.requests():
            k = request_kind(method, path)
            out[k] = out.get(k, 0) + 1
        return out

    def fail_next(self, n: int, mode: str) -> None:
        with self.lock:
            self.fail = [mode] * n

    def random_faults(self, rates: dict[str, float] | None, seed: int = 0) -> None:
        """Fail requests at random, each independently: ``rates`` maps a mode ("503", "drop",
        "403") to its probability (``{"503": 0.1, "drop": 0.01}``: S3 throttling plus dropped
        connections); None stops. ``injected`` counts the faults by mode."""
        with self.lock:
            self.rates = dict(rates or {})
            self.rng = random.Random(seed)
            self.injected = {}

    def _random_mode(self) -> str | None:
        """(Under the lock.) The fault this request gets from ``random_faults``, if any."""
        if not self.rates:
            return None
        x = self.rng.random()
        for mode, p in self.rates.items():
            if x < p:
                self.injected[mode] = self.injected.get(mode, 0) + 1
                return mode
            x -= p
        return None

    def per_prefix_rate(self, rate: float | None, burst: float = 1.0) -> None:
        """Throttle as S3 does by key prefix (a partition serves a few thousand requests a
        second): each prefix (a request's path up to its last ``/``: ``/bucket/ckpts/`` for
        ``ckpts/run.data-…``, ``/bucket/ckpts/run/3f/`` for a hashed shard) gets a bucket of
        ``burst`` requests refilled at ``rate`` per second; a request finding it empty is
        answered ``503 SlowDown`` (a retry is a new request). None stops. A prefix whose
        requests number ``burst`` or fewer is never throttled, whatever the timing."""
        with self.lock:
            self.prefix_limit = None if rate is None else (float(rate), float(burst))
            self._buckets = {}
            self.slowdowns = {}
            self.prefix_requests = {}

    def _throttled(self, path: str) -> str | None:
        """(Under the lock.) "503" when the request's key prefix is over its rate."""
        if self.prefix_limit is None:
            return None
        rate, burst = self.prefix_limit
        prefix = path.partition("?")[0].rpartition("/")[0] + "/"
        self.prefix_requests[prefix] = self.prefix_requests.get(prefix, 0) + 1
        now = time.monotonic()
        tokens, then = self._buckets.get(prefix, (burst, now))
        tokens = min(burst, tokens + (now - then) * rate)
        if tokens < 1.0:
            self._buckets[prefix] = (tokens, now)
            self.slowdowns[prefix] = self.slowdowns.get(prefix, 0) + 1
            return "503"
        self._buckets[prefix] = (tokens - 1.0, now)
        return None

    def fail_after(self, n: int, mode: str) -> None:
        """Forward the next ``n`` requests, then fail one with ``mode`` ("403", "503",
        "drop"): a fault part-way through whatever runs next."""
        with self.lock:
            self.fail = ["pass"] * n + [mode]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_XML_TIME = re.compile(rb"<(LastModified|Initiated)>([^<]+)</\1>")


def _shift_xml_times(body: bytes, skew: float) -> bytes:
    """``body`` (an S3 XML answer) with its ``LastModified``/``Initiated`` times moved by
    ``skew`` seconds, in the same ISO 8601 form (``2026-01-02T03:04:05.000Z``)."""

    def shift(m: re.Match[bytes]) -> bytes:
        t = datetime.datetime.fromisoformat(m.group(2).decode().replace("Z", "+00:00"))
        t += datetime.timedelta(seconds=skew)
        text = t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        return b"<%s>%s</%s>" % (m.group(1), text.encode(), m.group(1))

    return _XML_TIME.sub(shift, body)


def opts_for(proxy: Proxy, **extra: str) -> dict[str, str]:
    """storage_options sending every request through `proxy`."""
    return {"endpoint": proxy.endpoint, "allow_http": "true", **extra}


@contextlib.contextmanager
def aws_environment(endpoint: str, key: str, secret: str) -> Iterator[None]:
    """The AWS_* variables that point the core's object-store client (and boto3) at
    ``endpoint``, put back as they were after."""
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def moto_environment() -> Iterator[Moto]:
    """A started moto server with the AWS_* variables that point the core's object-store
    client (and boto3) at it; both are put back as they were, and the server stopped, after."""
    m = Moto()
    try:
        with aws_environment(m.endpoint, "testing", "testing"):
            yield m
    finally:
        m.server.stop()
