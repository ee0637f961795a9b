"""Long Rust calls release the GIL: while one or two threads decode or save a
compressed 32-64 MB checkpoint, a pure-Python thread keeps counting.

How this can fail: with the GIL held for the whole Rust call, the counting thread advances only in
the short gaps between calls (one switch interval, 0.5 ms here, per call boundary), i.e. ~1% of
its free-running rate; ``test_measurement_detects_a_held_gil`` checks exactly that with a C call
that holds the GIL. The threshold (10% of the free rate) sits far from that and from what a
released GIL gives on a busy 2-core machine (typically 25-85%); each measurement is retried."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import shardpoint as sp

N_FLOATS = 16 << 20  # 64 MB of float32
ATTEMPTS = 3
RUN_S = 1.0
THRESHOLD = 0.10


class Counter(threading.Thread):
    """A pure-Python busy loop: progress means it held the GIL."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.n = 0
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            self.n += 1


@pytest.fixture(scope="module")
def big_ckpt(tmp_path_factory) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(N_FLOATS, dtype=np.float32) * 0.02).astype(np.float32)
    p = str(tmp_path_factory.mktemp("gil") / "big")
    sp.save_file({"w": w}, p, durable=False)
    with sp.open(p) as r:
        assert r.info("w").codec == "bytegroup-huffman"
    return p, w


@pytest.fixture(autouse=True)
def short_switch_interval():
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(old)


def free_rate() -> float:
    """Iterations per second of the counter with nothing else running (the main thread sleeps)."""
    c = Counter()
    c.start()
    time.sleep(0.05)
    n0, t0 = c.n, time.perf_counter()
    time.sleep(0.3)
    n1, t1 = c.n, time.perf_counter()
    c.stop = True
    c.join()
    return (n1 - n0) / (t1 - t0)


def progress_during(call, workers: int) -> tuple[float, int]:
    """Run ``call`` repeatedly in ``workers`` threads for RUN_S while a Counter runs.

    Returns (counter iterations per second spent inside ``call`` by worker 0, number of calls)."""
    c = Counter()
    spans: list[list[tuple[float, float, int, int]]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []
    start = threading.Barrier(workers + 1)

    def work(i: int) -> None:
        try:
            start.wait()
            end = time.perf_counter() + RUN_S
            while time.perf_counter() < end:
                n0, t0 = c.n, time.perf_counter()
                call()
                t1, n1 = time.perf_counter(), c.n
                spans[i].append((t0, t1, n0, n1))
        except BaseException as e:  # pragma: no cover - re-raised below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    c.start()
    for t in ts:
        t.start()
    start.wait()
    for t in ts:
        t.join()
    c.stop = True
    c.join()
    if errors:
        raise errors[0]
    busy = sum(t1 - t0 for t0, t1, _, _ in spans[0])
    counted = sum(n1 - n0 for _, _, n0, n1 in spans[0])
    return counted / max(busy, 1e-9), sum(len(s) for s in spans)


def fraction_of_free_rate(call, workers: int) -> list[tuple[float, int]]:
    """(counter progress during ``call`` / free rate, calls) per attempt, stopping at success."""
    results = []
    for _ in range(ATTEMPTS):
        rate = free_rate()
        during, calls = progress_during(call, workers)
        results.append((round(during / rate, 3), calls))
        if during / rate > THRESHOLD:
            break
    return results


def test_measurement_detects_a_held_gil() -> None:
    """The control: ``sum(range(n))`` runs in C holding the GIL (no eval-breaker checks).

    The counter still advances at each call's two boundaries, and on a loaded machine a
    boundary lasts as long as the OS takes to wake the thread waiting for the GIL, not one
    switch interval: with 3M ints (0.05-0.2 s a call) that leak measured 4-44% of the free
    rate beside two busy processes, above the threshold in 3 runs of 8. One thread making
    calls of 60M ints (about 1 s unloaded) makes the boundaries a small part of the time
    measured (a second thread's calls added boundaries and doubled the time)."""
    n = 60_000_000
    rate = free_rate()
    during, calls = progress_during(lambda: sum(range(n)), workers=1)
    assert during / rate < THRESHOLD, (during / rate, calls)


def test_decode_releases_gil(big_ckpt) -> None:
    p, w = big_ckpt
    with sp.open(p) as r:
        assert r["w"].tobytes() == w.tobytes()
        results = fraction_of_free_rate(lambda: r["w"], workers=1)
    assert max(f for f, _ in results) > THRESHOLD, (
        f"(counter fraction of its free rate, calls) per attempt: {results}: a pure-Python "
        "thread barely ran while Rust decoded, the GIL seems held"
    )


def test_two_threads_loading_release_gil(big_ckpt) -> None:
    p, _ = big_ckpt
    results = fraction_of_free_rate(lambda: sp.load_file(p), workers=2)
    assert max(f for f, _ in results) > THRESHOLD, f"counter progress per attempt: {results}"


def test_save_releases_gil(tmp_path, big_ckpt) -> None:
    _, w = big_ckpt
    half = w[: N_FLOATS // 2]
    out = str(tmp_path / "s")
    results = fraction_of_free_rate(lambda: sp.save_file({"w": half}, out, durable=False), 1)
    assert max(f for f, _ in results) > THRESHOLD, f"counter progress per attempt: {results}"
    assert sp.load_file(out)["w"].tobytes() == half.tobytes()
