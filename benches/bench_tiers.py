"""Multi-tier checkpoint benchmark (issue 43): four figures, measured side by side in one run.

    python benches/bench_tiers.py [--quick] [--mb 64]

1. ``blocking_ratio``: the time a local-tier save blocks the caller (``manager.save``: the
   values copied into reusable host buffers) over one memcpy of the same state (``np.copyto``
   into preallocated arrays); best of several, one process. Target <= 1.5.
2. ``restore_speedup``: 4 ranks as 2 nodes (gloo), the persistent tier on the local S3 server
   behind a real proxy limited to 150 MB/s. Restore time (slowest rank) with every local tier
   wiped (everything from the persistent tier) over the restore time with one node of two
   wiped (its parts from the other node's replicas), the median of 3 alternating pairs, each
   restore checked to have used exactly those tiers. Incompressible state. Target >= 5.
3. ``wrong_restores``: restores that were not exact or not the same step on every rank, over a
   kill (SIGKILL) at every named fault point, a wiped node, both nodes wiped and a corrupted
   replica. Target 0.
4. ``peer_cpu_ms``: CPU time of the peer path's work on one rank's part (read into a message,
   check, write, restore), one process: what bounds a peer restore given a core per rank.

The last line is ``blocking_ratio=.. restore_speedup=.. wrong_restores=.. peer_cpu_ms=..
load_average=.. cores=..`` (the 1-minute load average when it finished: the ratios are timings).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

import shardpoint as sp  # noqa: E402
from shardpoint.tiers import FAULT_POINTS  # noqa: E402


def blocking_ratio(mb: int, tmp: str) -> float:
    rng = np.random.default_rng(0)
    n = mb * (1 << 20) // 4 // 16
    values = [rng.standard_normal(n, dtype=np.float32) for _ in range(16)]
    variables = [sp.Variable(v) for v in values]
    ckpt = sp.Checkpoint(**{f"w{i}": v for i, v in enumerate(variables)})
    m = sp.TieredCheckpointManager(
        ckpt, os.path.join(tmp, "persist"), local_directory=os.path.join(tmp, "local"),
        local_every=1, persistent_every=10**9, local_max_to_keep=1,
    )  # fmt: skip
    dst = [np.empty_like(v) for v in values]
    copies, blocks = [], []
    for step in range(1, 7):
        t0 = time.perf_counter()
        for d, v in zip(dst, values, strict=True):
            np.copyto(d, v)
        copies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        m.save(step)
        blocks.append(time.perf_counter() - t0)
        m.wait()  # measure the call alone, not the previous save's background write
    m.close()
    # the first save allocates the reusable buffers (as the first memcpy faults its pages in)
    ratio = min(blocks[1:]) / min(copies[1:])
    print(f"blocking: save {min(blocks[1:]) * 1e3:.1f} ms, memcpy {min(copies[1:]) * 1e3:.1f} ms "
          f"of {mb} MiB -> ratio {ratio:.2f}")  # fmt: skip
    return ratio


def peer_path_cpu(mb: int, tmp: str) -> float:
    """CPU seconds (all threads, best of 5, one process) of what the peer path does with one
    rank's part: the holder reads it into a message, the receiver checks and writes it and
    restores from it (the transfer itself left out). With a core per rank this, not the
    link, bounds a peer restore."""
    from shardpoint.tiers.parts import decode_parts, read_parts_message, write_part

    n = mb * (1 << 20) // 4
    ckpt = sp.Checkpoint(w=sp.Variable(np.random.default_rng(0).standard_normal(n, np.float32)))
    src = os.path.join(tmp, "holder", "ckpt-1")
    ckpt.write(src, compression=None)  # the local tier's codec (TieredCheckpointManager's)
    best = float("inf")
    for i in range(5):
        dst = os.path.join(tmp, f"receiver-{i}", "ckpt-1")
        t0 = time.process_time()
        message, _ = read_parts_message([(src, 0, 1, "t", None)])
        (part,) = decode_parts(message, "holder")
        write_part(part, dst, durable=False)
        ckpt.restore(dst, verify=False)
        best = min(best, time.process_time() - t0)
    print(f"peer path CPU per {mb} MiB part (read, check, write, restore): {best * 1e3:.0f} ms")
    return best


def receive_choice(mb: int, tmp: str) -> None:
    """Why a received part is written from its receive buffer rather than received straight
    into an ``mmap`` of the destination file: CPU of each way for one part (best of 6)."""
    import mmap

    n = mb << 20
    src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    os.makedirs(tmp, exist_ok=True)

    def buffer_then_write(path: str) -> None:
        buf = np.empty(n, np.uint8)
        buf[:] = src  # what the recv writes
        with open(path, "wb") as f:
            f.write(buf.data)

    def into_file(path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, n)
            with mmap.mmap(fd, n) as m:
                np.frombuffer(m, np.uint8)[:] = src  # what the recv would write
        finally:
            os.close(fd)

    best = {}
    for fn in (buffer_then_write, into_file):
        times = []
        for i in range(6):
            path = os.path.join(tmp, f"{fn.__name__}-{i}")
            t0 = time.process_time()
            fn(path)
            times.append(time.process_time() - t0)
            os.unlink(path)
        best[fn.__name__] = min(times)
    print(f"receive {mb} MiB: into a buffer then write {best['buffer_then_write'] * 1e3:.0f} ms "
          f"CPU, into an mmap of the file {best['into_file'] * 1e3:.0f} ms CPU")  # fmt: skip


def _slowest_restore(outs: list[dict], tiers: list[str]) -> tuple[float, bool]:
    """The slowest rank's restore time, and whether every rank restored the same step exactly.
    ``tiers``: where each rank's part must have come from (else the figure would time some
    other path than the one it names)."""
    events = [o["events"][-1] for o in outs]
    same = len({e[1] for e in events}) == 1 and all(e[2] for e in events)
    got = events[0][4]
    assert got == tiers, f"restored from {got}, the measurement needs {tiers}"
    return max(e[3] for e in events), same


def restore_speedup(mb_per_rank: int, tmp: str, repeats: int = 3) -> tuple[float, int]:
    """Median over ``repeats`` alternating pairs of restores (one node wiped, both wiped) of
    the same saved step, each from a fresh copy of the saved job."""
    import statistics

    from s3_server import Proxy
    from s3server import s3_environment
    from tiers_helpers.job import WORLD, run_job

    wrong = 0
    times: dict[str, list[float]] = {"tiered": [], "persistent": []}
    with s3_environment() as store:
        proxy = Proxy(store.port, rate_bytes_per_s=150e6)
        try:
            env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
            env["AWS_ENDPOINT_URL"] = proxy.endpoint
            cfg = {
                "persistent": f"s3://{store.bucket()}/job", "env": env, "noise": True,
                "n": mb_per_rank * (1 << 20) // 4, "local_every": 10, "persistent_every": 10,
            }  # fmt: skip
            codes, outs = run_job(tmp, [["save", [10]]], cfg, timeout=240)
            assert codes == [0] * WORLD, [o.get("error") for o in outs]
            base = tmp + "-base"
            shutil.copytree(tmp, base)
            cases = (
                # node 0's ranks restore their own copies; node 1's get theirs from node 0
                ("tiered", (1,), ["local", "local", "peer", "peer"]),
                # every rank's part over the one rate-limited link
                ("persistent", (0, 1), ["persistent"] * WORLD),
            )
            for _ in range(repeats):
                for name, wiped, tiers in cases:
                    shutil.rmtree(tmp)
                    shutil.copytree(base, tmp)
                    for n in wiped:
                        shutil.rmtree(os.path.join(tmp, f"node-{n}"))
                    codes, outs = run_job(tmp, [["restore"]], cfg, timeout=240)
                    assert codes == [0] * WORLD, [o.get("error") for o in outs]
                    seconds, ok = _slowest_restore(outs, tiers)
                    times[name].append(seconds)
                    wrong += not ok
        finally:
            proxy.close()
    tiered = statistics.median(times["tiered"])
    persistent = statistics.median(times["persistent"])
    total = WORLD * mb_per_rank
    print(f"restore of {total} MiB on 4 ranks (median of {repeats}): one node wiped "
          f"{tiered:.2f} s {[round(t, 2) for t in times['tiered']]}, all from the persistent "
          f"tier (150 MB/s link) {persistent:.2f} s {[round(t, 2) for t in times['persistent']]}"
          f" -> speed-up {persistent / tiered:.1f}x")  # fmt: skip
    return persistent / tiered, wrong


def wrong_restores(tmp: str) -> tuple[int, int]:
    """(wrong restores, restores) over every fault point and damaged tier (tests/tiers has the
    same scenarios as assertions)."""
    sys.path.insert(0, str(ROOT / "tests" / "tiers"))
    from test_tiers_multiprocess import KILLS

    from tiers_helpers.job import WORLD, run_job

    base = os.path.join(tmp, "base")
    cfg = lambda d, **kw: {"local_every": 10, "persistent_every": 20, "n": 20000,  # noqa: E731
                           "persistent": os.path.join(d, "persist"), **kw}  # fmt: skip
    codes, _ = run_job(base, [["save", [10, 20]]], cfg(base))
    assert codes == [0] * WORLD
    wrong = total = 0

    def restore(d: str, expected: int) -> None:
        nonlocal wrong, total
        codes, outs = run_job(d, [["restore"]], cfg(d))
        total += 1
        if codes != [0] * WORLD:
            wrong += 1
            return
        events = [o["events"][-1] for o in outs]
        if {e[1] for e in events} != {expected} or not all(e[2] for e in events):
            wrong += 1

    for i, point in enumerate(FAULT_POINTS):
        rank, steps, wipe, expected = KILLS[point]
        d = os.path.join(tmp, f"kill-{i}")
        shutil.copytree(base, d)
        fault = f"{point}@{rank}#{steps[-1] if point.startswith('persistent') else 30}"
        run_job(d, [["save", steps]], cfg(d, fault=fault), timeout=60)
        for n in wipe:
            shutil.rmtree(os.path.join(d, f"node-{n}"))
        restore(d, expected)
    for name, wipe, corrupt in (
        ("wipe1", [1], False),
        ("wipe2", [0, 1], False),
        ("corrupt", [1], True),
    ):
        d = os.path.join(tmp, name)
        shutil.copytree(base, d)
        for n in wipe:
            shutil.rmtree(os.path.join(d, f"node-{n}"))
        if corrupt:
            r = os.path.join(d, "node-0", "rank-00000", "replica-00002")
            path = os.path.join(r, next(x for x in os.listdir(r) if x.startswith("ckpt-20.data-")))
            data = bytearray(open(path, "rb").read())
            data[len(data) // 2] ^= 1
            open(path, "wb").write(bytes(data))
        restore(d, 20)
    print(f"fault scenarios: {total} restores, {wrong} wrong")
    return wrong, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller state (about a minute)")
    ap.add_argument("--mb", type=int, default=None, help="state per rank in MiB")
    args = ap.parse_args()
    mb = args.mb or (32 if args.quick else 256)
    with tempfile.TemporaryDirectory() as tmp:
        ratio = blocking_ratio(mb * 2, os.path.join(tmp, "blocking"))
        cpu = peer_path_cpu(mb, os.path.join(tmp, "cpu"))
        receive_choice(mb, os.path.join(tmp, "receive"))
        speedup, wrong_speed = restore_speedup(mb, os.path.join(tmp, "restore"))
        wrong, _ = wrong_restores(os.path.join(tmp, "faults"))
    load = os.getloadavg()[0]  # the figures are timings: say how busy the machine was
    print(
        f"blocking_ratio={ratio:.2f} restore_speedup={speedup:.1f} "
        f"wrong_restores={wrong + wrong_speed} peer_cpu_ms={cpu * 1e3:.0f} "
        f"load_average={load:.1f} cores={os.cpu_count()}"
    )


if __name__ == "__main__":
    main()
