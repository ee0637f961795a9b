"""Cost of the strong digest manifest (FORMAT.md §7.1), measured side by side in one run.

Not a test: it prints figures. Two parts:

1. the hash alone, single thread, in the writer's own code (``_core.digest_bytes``: the
   ``sha2`` and ``blake3`` crates as built into the core), beside crc32c for scale;
2. a save of about 1 GB of fp32 weights (a transformer-like set of ~100 tensors) without a
   digest, with ``digest="sha256"`` and with ``digest="blake3"``, rounds interleaved so that
   load drift on a shared machine hits every variant alike; best of ``--rounds``. Both the
   default codec and ``compression="none"`` (where writing is cheapest, so the hash weighs most).
   Then ``verify()`` versus ``verify(strong=True)``.

    .venv/bin/python benches/bench_digest.py [--mb 1024] [--rounds 3] [--durable]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np

import shardpoint as sp
from shardpoint import _core

GB = 1e9


def best_of(fn: Callable[[], object], rounds: int) -> float:
    """Best wall time of ``rounds`` calls."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def weights(total_mb: int, seed: int = 0) -> dict[str, np.ndarray]:
    """~``total_mb`` MB of fp32 tensors shaped like transformer layers (normal, std 0.02)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    n, i = 0, 0
    while n < total_mb * 1_000_000:
        shape = (1024, 1024) if i % 4 else (4096, 1024)
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        out[f"layer{i // 4}/w{i % 4}"] = a
        n += a.nbytes
        i += 1
    return out


def hash_alone(mb: int, rounds: int) -> None:
    """GB/s of each hash over one buffer, single thread."""
    buf = np.random.default_rng(1).integers(0, 256, mb << 20, dtype=np.uint8)
    print(f"hash alone, {mb} MiB buffer, single thread, best of {rounds}:")
    rows = [
        ("crc32c (for scale)", lambda: _core.crc32c(buf)),
        ("sha256 (sha2 crate)", lambda: _core.digest_bytes("sha256", buf)),
        ("blake3 (blake3 crate)", lambda: _core.digest_bytes("blake3", buf)),
    ]
    for name, fn in rows:
        t = best_of(fn, rounds)
        print(f"  {name:24s} {buf.nbytes / t / GB:6.2f} GB/s")


def saves(mb: int, rounds: int, durable: bool) -> None:
    """Save time without and with each digest, rounds interleaved."""
    tensors = weights(mb)
    total = sum(a.nbytes for a in tensors.values())
    d = tempfile.mkdtemp(prefix="bench_digest_")
    variants: list[str | None] = [None, "sha256", "blake3"]
    try:
        for compression in ("zstd", "none"):
            times: dict[str | None, float] = dict.fromkeys(variants, float("inf"))
            for _ in range(rounds):
                for v in variants:
                    p = os.path.join(d, f"ck-{v}")
                    gc.collect()
                    t = time.perf_counter()
                    sp.save_file(tensors, p, compression=compression, digest=v, durable=durable)
                    times[v] = min(times[v], time.perf_counter() - t)
                    if v is not None:
                        sp.remove(p)
            base = times[None]
            print(
                f"save {total / GB:.2f} GB fp32, compression={compression!r}, "
                f"durable={durable}, best of {rounds}:"
            )
            for v in variants:
                t = times[v]
                extra = "" if v is None else f"  (+{(t - base) / base * 100:5.1f}% of the save)"
                print(f"  digest={v!s:7s} {t:7.2f} s  {total / t / GB:5.2f} GB/s{extra}")
            p = os.path.join(d, "ck-verify")
            sp.save_file(tensors, p, compression=compression, digest="sha256", durable=False)
            with sp.open(p) as r:
                tv = best_of(r.verify, rounds)
                ts = best_of(lambda r=r: r.verify(strong=True), rounds)
            print(f"  verify() {tv:.2f} s, verify(strong=True) sha256 {ts:.2f} s")
            sp.remove(p)
            sp.remove(os.path.join(d, "ck-None"))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the saved set in MB")
    ap.add_argument("--hash-mb", type=int, default=256, help="buffer hashed alone, MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--durable", action="store_true", help="fsync (default: page cache only)")
    a = ap.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    hash_alone(a.hash_mb, a.rounds)
    saves(a.mb, a.rounds, a.durable)


if __name__ == "__main__":
    main()
