"""The README's demo (``make demo`` / ``python -m shardpoint.demo``).

Builds a ~1 GB transformer-like fp32 model from seeded normal values, saves it as a shardpoint
checkpoint twice (uncompressed and with the default codec: byte-grouped planes, Huffman-coded
exponents), reopens it lazily, reads a few tensors and a slice, verifies every checksum, loads it
in a fresh process (first load beside warm ones), and prints sizes and timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shardpoint as sp


def build_model(scale: float = 1.0, seed: int = 0) -> dict[str, np.ndarray]:
    """~1 GB of fp32 at scale 1: an embedding, four 4096x4096 projections, 12 blocks."""
    rng = np.random.default_rng(seed)

    def w(rows: int, *rest: int, std: float = 0.02) -> np.ndarray:
        shape = (max(1, int(rows * scale)), *rest)
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    m = {"embed/weight": w(32000, 1024)}
    for i in range(4):
        m[f"proj/{i}/weight"] = w(4096, 4096)
    for b in range(12):
        for n in ("q", "k", "v", "o"):
            m[f"blocks/{b}/attn/{n}/weight"] = w(1024, 1024)
            m[f"blocks/{b}/attn/{n}/bias"] = w(1024, std=0.01)
        m[f"blocks/{b}/mlp/up/weight"] = w(4096, 1024)
        m[f"blocks/{b}/mlp/down/weight"] = w(1024, 4096)
        for ln in ("ln1", "ln2"):
            m[f"blocks/{b}/{ln}/weight"] = 1 + w(1024, std=0.05)
            m[f"blocks/{b}/{ln}/bias"] = w(1024, std=0.01)
    return m


def _size(prefix: str) -> int:
    d, base = os.path.split(prefix)
    return sum(
        os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.startswith(base + ".")
    )


def _timed(label: str, fn: Callable[[], Any], nbytes: int | None) -> Any:
    """Run ``fn``, print its time and, for a step that moves ``nbytes``, its rate (an open
    reads a header of a few hundred bytes: a rate in GB/s says nothing about it)."""
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    rate = f"  {nbytes / dt / 1e9:6.2f} GB/s" if nbytes else ""
    print(f"  {label:<46} {dt * 1e3:9.1f} ms{rate}")
    return out


_FRESH = """
import json, sys, time
import shardpoint as sp
ts = []
for _ in range(4):
    t = time.perf_counter()
    d = sp.load_file(sys.argv[1])
    ts.append(time.perf_counter() - t)
    del d
print(json.dumps(ts))
"""


def _first_vs_warm(prefix: str, nbytes: int) -> None:
    """Load `prefix` in a fresh process: its first load (cold thread pool, allocator and page
    tables) beside the best of three warm ones."""
    r = subprocess.run(
        [sys.executable, "-c", _FRESH, prefix], capture_output=True, text=True, check=True
    )
    ts = json.loads(r.stdout.strip().splitlines()[-1])
    first, warm = ts[0], min(ts[1:])
    print(
        f"  {'load_file compressed, fresh process: first':<46} {first * 1e3:9.1f} ms  "
        f"{nbytes / first / 1e9:6.2f} GB/s"
    )
    print(
        f"  {'                     same process: warm':<46} {warm * 1e3:9.1f} ms  "
        f"{nbytes / warm / 1e9:6.2f} GB/s  (first = {warm / first:.2f}x warm speed)"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the demo; ``--scale 0.1`` makes it ~100 MB."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="model size factor (1.0 = ~1 GB)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="shardpoint-demo-")
    os.makedirs(work, exist_ok=True)
    try:
        print(f"shardpoint {sp.__version__} demo (format v{sp.FORMAT_VERSION}), writing to {work}")
        t = time.perf_counter()
        model = build_model(args.scale)
        nbytes = sum(v.nbytes for v in model.values())
        print(
            f"built {len(model)} tensors, {nbytes / 1e9:.3f} GB fp32 in {time.perf_counter() - t:.1f} s\n"
        )

        raw = os.path.join(work, "model-raw")
        comp = os.path.join(work, "model")
        print("save (durable: fsync + atomic rename)")
        _timed(
            "save_file compression='none'",
            lambda: sp.save_file(model, raw, compression="none"),
            nbytes,
        )
        _timed(
            "save_file compression='zstd' (default codec)",
            lambda: sp.save_file(model, comp, metadata={"step": 1000}),
            nbytes,
        )
        print(
            f"\nsizes: raw {_size(raw) / 1e6:.1f} MB, compressed {_size(comp) / 1e6:.1f} MB, "
            f"ratio {_size(raw) / _size(comp):.3f}"
        )

        print("\nlazy open and reads")
        r = _timed("open (index header only)", lambda: sp.open(comp), None)
        with r:
            print(
                f"  {len(r)} keys; metadata {r.metadata}; {len(r.prefix('blocks/3/'))} keys under blocks/3/"
            )
            info = r.info("proj/0/weight")
            print(
                f"  proj/0/weight: {info.dtype}{list(info.shape)} codec={info.codec} "
                f"{info.chunks} chunks, ratio {info.ratio:.3f}"
            )
            w = _timed(
                "read proj/0/weight (decode, 2 threads)", lambda: r["proj/0/weight"], info.raw_bytes
            )
            assert np.array_equal(w, model["proj/0/weight"]), "round trip mismatch"
            rows = _timed(
                "slice embed/weight[100:164] (needed chunks only)",
                lambda: r.slice("embed/weight", 100, 164),
                64 * 4096,
            )
            assert np.array_equal(rows, model["embed/weight"][100:164])
            _timed("verify() every crc32c (compressed file)", r.verify, _size(comp))
        with sp.open(raw) as rr:
            loaded = _timed("load_file raw (zero-copy mmap + crc check)", lambda: rr.load(), nbytes)
            assert all(
                np.array_equal(loaded[k], model[k]) for k in ("embed/weight", "blocks/0/ln1/bias")
            )
            _timed("verify() every crc32c (raw file)", rr.verify, nbytes)
        loaded = _timed(
            "load_file compressed (parallel decode + crc)", lambda: sp.load_file(comp), nbytes
        )
        assert all(np.array_equal(loaded[k], v) for k, v in model.items()), "round trip mismatch"
        # The fresh arrays above cost their first touch (page faults, and on a VM the host
        # backing memory the guest has not used lately); decoding into existing arrays (a
        # model's own tensors) costs only the decoder.
        for v in loaded.values():
            v.fill(0)
        with sp.open(comp) as rc:
            targets: dict[str, np.ndarray] = loaded
            _timed(
                "load_into existing arrays (compressed)",
                lambda: rc.load_into(targets),
                nbytes,
            )
        assert all(np.array_equal(loaded[k], v) for k, v in model.items()), "round trip mismatch"
        del loaded
        _first_vs_warm(comp, nbytes)
        print("\nall values round-tripped bit for bit; every checksum verified")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
