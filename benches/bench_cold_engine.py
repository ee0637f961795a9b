"""The cold-read engine alone (issue 41): one safetensors file's tensors read, page cache
evicted, into pre-faulted arrays, with no model and no copy_, by each way this package has of
reading it, beside ``dd`` and ``fio`` on the same file in the same run; rounds interleaved.

    .venv/bin/python benches/bench_cold_engine.py [--out /tmp/spbench-load] [--rounds 3]
        [--before DIR] [--ways buffered,direct,direct_placed]

``--out``: bench_load.py's work directory (its ``hf/model.safetensors``; written if absent).
Ways, each timed in a fresh process:
- ``buffered``: ``read_ranges_into`` (page cache; ``posix_fadvise`` read-ahead; runs of
  tensors lying end to end filled by one ``preadv`` each);
- ``direct``: ``read_ranges_direct`` into ordinary arrays: ``O_DIRECT`` into an aligned bounce
  buffer, then a copy (the arrays are not placed congruent to their file offsets);
- ``direct_placed``: ``read_ranges_direct`` into arrays placed at their file offset modulo
  4096 (one anonymous mapping): the device writes straight into them;
- ``buffered@before``: ``buffered`` with ``--before``'s package (a copy of an older tree's
  ``python`` directory).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GB = 1e9


def child(way: str, path: str) -> None:
    """Time one read of every tensor of ``path``; print ``{"gbps": ...}``."""
    import numpy as np

    import shardpoint as sp
    from shardpoint.storage import read_ranges_into

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    base = 8 + n
    spans = sorted(
        (base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
        for k, v in header.items()
        if k != "__metadata__" and v["data_offsets"][1] > v["data_offsets"][0]
    )
    total = sum(n for _, n in spans)
    if way == "direct_placed":  # one mapping, each array at its file offset modulo 4096
        m = mmap.mmap(-1, total + 4096 * (len(spans) + 1))
        buf = np.frombuffer(m, np.uint8)
        outs, at = [], 0
        for off, n in spans:
            at += (off - at) % 4096
            outs.append(buf[at : at + n])
            at += n
    else:
        outs = [np.empty(n, np.uint8) for _, n in spans]
    for o in outs:
        o.fill(1)  # pre-faulted, as a model's parameters are
    ranges = [(0, off) for off, _ in spans]
    t = time.perf_counter()
    if way.startswith("buffered"):
        read_ranges_into([path], ranges, outs)
    else:
        sp.storage.read_ranges_direct([path], ranges, outs)
    dt = time.perf_counter() - t
    with open(path, "rb") as f:  # spot check: the last tensor's last bytes arrived
        off, n = spans[-1]
        f.seek(off + n - 64)
        assert bytes(outs[-1][-64:]) == f.read(64)
    print(json.dumps({"gbps": total / GB / dt}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/spbench-load"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None)
    ap.add_argument("--ways", default="buffered,direct,direct_placed")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    from bench_load import device_limit, evict, setup

    path = setup(args.out, 1.0)["safetensors_copy"][0]
    ways = args.ways.split(",") + (["buffered@before"] if args.before else [])
    print(f"cold engine probe; cpus={os.cpu_count()} load average={os.getloadavg()}; {path}")
    got: dict[str, list[float]] = {}
    limits: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        for k, v in device_limit(path).items():
            limits.setdefault(k, []).append(v)
        for way in ways:
            env = dict(os.environ)
            pkg = args.before if way.endswith("@before") else HERE.parent / "python"
            env["PYTHONPATH"] = os.pathsep.join([str(pkg), env.get("PYTHONPATH", "")])
            evict([path])
            r = subprocess.run(
                [sys.executable, __file__, "--child", way, path],
                env=env,
                capture_output=True,
                text=True,
            )
            if r.returncode:
                print(f"  {way}: failed\n{r.stderr[-2000:]}")
                continue
            g = json.loads(r.stdout.strip().splitlines()[-1])["gbps"]
            got.setdefault(way, []).append(g)
            print(f"  {way}: {g:.2f} GB/s", flush=True)
        print(f"round {rnd + 1}/{args.rounds} done; load average={os.getloadavg()}", flush=True)
    print("\n| what | best GB/s | median GB/s |\n|---|---|---|")
    for k, v in list(limits.items()) + list(got.items()):
        print(f"| {k} | {max(v):.2f} | {statistics.median(v):.2f} |")
    print(f"load average at the end={os.getloadavg()}")


if __name__ == "__main__":
    main()
