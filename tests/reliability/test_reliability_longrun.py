"""Long runs (issue 7, part 5): many consecutive manager saves and restores in one process
without growth in open file descriptors, memory mappings or resident memory.

``SHARDPOINT_LONGRUN_SAVES`` sets the count (default 1,000: about 30 s here, each save fsyncs).
Growth is measured from a warm-up point (after the first 10% of iterations: allocator arenas,
thread pools and caches settle) to the end.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers.crash_child import make_checkpoint, state_for, step_of

# an exhaustive sweep: `make test` runs it, `make test-quick` leaves it out
pytestmark = pytest.mark.slow

SAVES = int(os.environ.get("SHARDPOINT_LONGRUN_SAVES", "1000"))
MAX_FD_GROWTH = 2
MAX_MAPS_GROWTH = 16
MAX_RSS_GROWTH = 48 << 20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_many_saves_and_restores_do_not_leak(tmp_path) -> None:
    d = str(tmp_path)
    ck = make_checkpoint()
    mgr = sp.CheckpointManager(ck, d, max_to_keep=3)
    fresh = make_checkpoint()
    warm = max(1, SAVES // 10)
    base: tuple[int, int, int] | None = None
    t0 = time.perf_counter()
    for step in range(1, SAVES + 1):
        vals = state_for(step)
        ck.w.assign(vals["w"])
        ck.b.assign(vals["b"])
        path = mgr.save()
        # restore into another object, and read through a reader and load_file as users do
        fresh.restore(sp.latest_checkpoint(d)).assert_consumed()
        assert int(fresh.b.numpy()[0]) == step
        if step % 50 == 0:
            with sp.open(path) as r:
                assert step_of(r.load()) == step
                r.verify()
            assert step_of(sp.load_file(path)) == step
        if step == warm:
            base = (_fds(), _maps(), _rss())
    elapsed = time.perf_counter() - t0
    assert base is not None
    end = (_fds(), _maps(), _rss())
    print(
        f"\nlongrun: {SAVES} saves+restores in {elapsed:.1f}s; fds {base[0]}->{end[0]}, "
        f"maps {base[1]}->{end[1]}, rss {base[2] >> 20}->{end[2] >> 20} MiB"
    )
    assert end[0] - base[0] <= MAX_FD_GROWTH, f"file descriptors grew {base[0]} -> {end[0]}"
    assert end[1] - base[1] <= MAX_MAPS_GROWTH, f"mappings grew {base[1]} -> {end[1]}"
    assert end[2] - base[2] <= MAX_RSS_GROWTH, f"RSS grew {base[2] >> 20} -> {end[2] >> 20} MiB"
    assert len([n for n in os.listdir(d) if n.endswith(".index")]) == 3
    assert np.array_equal(fresh.w.numpy(), state_for(SAVES)["w"])
