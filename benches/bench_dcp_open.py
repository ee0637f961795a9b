"""A loading rank's open of a DCP checkpoint saved by N simulated ranks (docs/SCALE.md, issue
42): ``read_metadata`` + ``set_up``, the local plan and ``read_data`` of a few loading ranks
(M = 3N/4) under ``time.process_time``, in fresh processes, to compare two builds side by side:
this one and, with ``--before DIR`` (a copy of another build's ``python/`` directory, its
``_core`` included), that one, alternating. Both read the same checkpoints: one saved by this
build (chunk table compressed) and, with ``--old``, one saved by the ``--before`` build.

    python benches/bench_dcp_open.py --n 4096 --before /tmp/before/python --old --rounds 2

The checkpoints are saved once through ``tests/scale_harness.dcp_save`` (100 tensors, 3 rows
of 4 float32 per saving rank) and removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TENSORS, ROWS, COLS = 100, 3, 4


def _save(prefix: str, n: str) -> None:
    """(In a fresh process, with the saving build first on sys.path.)"""
    sys.path.insert(0, str(ROOT / "tests"))
    import scale_harness as h

    h.dcp_save(prefix, int(n), tensors=TENSORS, rows=ROWS, cols=COLS, planner="ours")


def _open(prefix: str, ranks: str, planner: str) -> None:
    """(In a fresh process.) One line per measured loading rank: CPU seconds of
    read_metadata + set_up, the local plan, read_data, and the chunk table's stored bytes."""
    sys.path.insert(0, str(ROOT / "tests"))
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    import scale_harness as h
    import shardpoint as sp
    from shardpoint.torch.dcp import StorageReader
    from shardpoint.torch.dcp_load_planner import LoadPlanner

    with sp.open(prefix) as r:
        table = r.info(".dcp_metadata.chunks").stored_bytes
    n = int(ranks)
    m = 3 * n // 4
    for j in (0, m // 2, m - 1):
        state = {f"t{i:03d}": h._loading_shard(j, m, ROWS * n, COLS) for i in range(TENSORS)}
        p = LoadPlanner() if planner == "ours" else DefaultLoadPlanner()
        reader = StorageReader(prefix)
        gc.collect()
        c0 = time.process_time()
        md = reader.read_metadata()
        reader.set_up_storage_reader(md, j == 0)
        p.set_up_planner(state, md, j == 0)
        c1 = time.process_time()
        plan = reader.prepare_local_plan(p.create_local_plan())
        c2 = time.process_time()
        reader.read_data(p.finish_plan(plan), p).wait()
        c3 = time.process_time()
        print(f"{c1 - c0:.4f} {c2 - c1:.4f} {c3 - c2:.4f} {table}", flush=True)


def _run(python_dir: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": python_dir}
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'benches')!r}); "
        f"import bench_dcp_open as b; b.{args[0]}(*{args[1:]!r})"
    )
    cmd = [sys.executable, "-c", code]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{args[0]} under {python_dir} failed:\n{done.stderr}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="saving ranks")
    ap.add_argument("--before", help="python/ directory of the build to compare with")
    ap.add_argument("--old", action="store_true", help="also a checkpoint saved by --before")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dir", help="where to save the checkpoints (default: the temp dir)")
    ap.add_argument("--planners", nargs="+", default=["ours"], choices=["ours", "dcp"])
    args = ap.parse_args()
    here = str(ROOT / "python")
    builds = {"after": here, **({"before": args.before} if args.before else {})}
    tmp = tempfile.mkdtemp(prefix="bench_dcp_open-", dir=args.dir)
    try:
        ckpts = {"saved by after": os.path.join(tmp, "new", "ckpt")}
        _run(here, "_save", ckpts["saved by after"], str(args.n))
        if args.old and args.before:
            ckpts["saved by before"] = os.path.join(tmp, "old", "ckpt")
            _run(args.before, "_save", ckpts["saved by before"], str(args.n))
        rows: dict[tuple[str, str, str], list[list[float]]] = {}
        for _ in range(args.rounds):
            for ck, prefix in ckpts.items():
                for planner in args.planners:
                    for build, d in builds.items():
                        out = _run(d, "_open", prefix, str(args.n), planner)
                        got = [list(map(float, line.split())) for line in out.split("\n") if line]
                        rows.setdefault((ck, planner, build), []).extend(got)
        print(f"N={args.n} M={3 * args.n // 4}, median over loading ranks and rounds (CPU s):")
        for (ck, planner, build), got in rows.items():
            med = [statistics.median(col) for col in zip(*got, strict=True)]
            print(
                f"  {ck:16s} planner={planner:4s} {build:6s} read_metadata={med[0]:.4f} "
                f"plan={med[1]:.4f} read_data={med[2]:.4f} chunk_table_bytes={med[3]:.0f}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
