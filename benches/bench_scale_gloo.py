"""Real torch.distributed saves with a few gloo processes (docs/SCALE.md), beside the simulated
ranks of bench_scale.py: every rank a process, through both paths.

    python benches/bench_scale_gloo.py                       # 8 ranks, local directory
    python benches/bench_scale_gloo.py --store s3            # moto behind the counting proxy

Paths, each saved ``--saves`` times (a save of the same layout after the first):

- ``writer``: ``sp.Writer(prefix, rank=r, world_size=W)`` on every rank, a barrier, ``sp.merge``
  on rank 0 (what ``sp.CheckpointManager``-less multi-writer code does);
- ``dcp-default``: ``dcp.save`` of ``--tensors`` row-sharded DTensors per rank through our
  StorageWriter with DCP's ``DefaultSavePlanner``;
- ``dcp-ours``: the same with shardpoint's ``SavePlanner`` (its plan cache hits from the second
  save on); then ``dcp.load`` with DCP's ``DefaultLoadPlanner`` and with ours.

Reported per save, from rank 0: wall time of the save (barrier to barrier), the coordinator's
CPU in the global plan and in ``StorageWriter.finish`` (merge included), and with ``--store s3``
the requests per rank of each phase (counted at the proxy; rank 0 marks the phases with a GET
of an absent object after a barrier).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))


# --------------------------------------------------------------------------------------------
# one rank
# --------------------------------------------------------------------------------------------


def _timed(obj: Any, name: str, into: dict[str, float]) -> None:
    """Wrap method ``name`` of ``obj`` so that its CPU time is added to ``into[name]``."""
    fn = getattr(obj, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        c0 = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            into[name] = into.get(name, 0.0) + time.process_time() - c0

    setattr(obj, name, wrapped)


def rank_main(rank: int, world: int, init: str, base: str, tensors: int, saves: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        DefaultSavePlanner,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import shardpoint as sp
    import shardpoint.torch as spt
    from shardpoint.errors import NotFoundError

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    rows, cols = 4, 16
    out: list[dict[str, Any]] = []

    def mark(name: str) -> None:
        dist.barrier()
        if rank == 0 and base.startswith("s3://"):
            with contextlib.suppress(NotFoundError):
                sp.storage.read_object(f"{base}/phase-{name}")
        dist.barrier()

    for s in range(saves):
        prefix = f"{base}/writer/ckpt-{s}"
        mark(f"writer-{s}")
        t0 = time.perf_counter()
        with sp.Writer(prefix, rank=rank, world_size=world, merge_token=f"w{s}") as w:
            for i in range(tensors):
                w.add(f"r{rank:05d}/t{i:03d}", np.full(rows * cols, rank + s, np.float32))
        dist.barrier()
        cpu = 0.0
        if rank == 0:
            c0 = time.process_time()
            sp.merge(prefix, world, token=f"w{s}")
            cpu = time.process_time() - c0
        dist.barrier()
        out.append({"path": "writer", "save": s, "wall": time.perf_counter() - t0, "merge": cpu})

    def state(s: int) -> dict[str, Any]:
        local = torch.full((rows, cols), float(rank + s))
        return {
            f"t{i:03d}": DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            for i in range(tensors)
        }

    for kind in ("dcp-default", "dcp-ours"):
        for s in range(saves):
            prefix = f"{base}/{kind}/ckpt-{s}"
            planner = DefaultSavePlanner() if kind == "dcp-default" else spt.SavePlanner()
            writer = spt.StorageWriter(prefix)
            cpu: dict[str, float] = {}
            _timed(planner, "create_global_plan", cpu)
            _timed(writer, "finish", cpu)
            sd = state(s)
            mark(f"{kind}-{s}")
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=writer, planner=planner)
            dist.barrier()
            out.append({"path": kind, "save": s, "wall": time.perf_counter() - t0, **cpu})

    for kind, make in (("load-default", DefaultLoadPlanner), ("load-ours", spt.LoadPlanner)):
        target = {
            f"t{i:03d}": DTensor.from_local(torch.zeros(rows, cols), mesh, [Shard(0)])
            for i in range(tensors)
        }
        planner = make()
        cpu = {}
        _timed(planner, "create_local_plan", cpu)
        mark(kind)
        t0 = time.perf_counter()
        dcp.load(
            target,
            storage_reader=spt.StorageReader(f"{base}/dcp-ours/ckpt-{saves - 1}"),
            planner=planner,
        )
        dist.barrier()
        want = float(rank + saves - 1)
        assert all(bool((t.to_local() == want).all()) for t in target.values())
        out.append({"path": kind, "wall": time.perf_counter() - t0, **cpu})
    mark("end")
    if rank == 0:
        for row in out:
            print("RESULT " + json.dumps(row), flush=True)
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# the launcher
# --------------------------------------------------------------------------------------------


def _phases(log: list[tuple[str, str, str | None]], ranks: int) -> dict[str, dict[str, float]]:
    from s3_server import request_kind

    phases: dict[str, dict[str, float]] = {}
    name = "start"
    for method, path, _ in log:
        key = path.partition("?")[0]
        if "/phase-" in key:
            name = key.rsplit("/phase-", 1)[1]
            continue
        kind = request_kind(method, path)
        phases.setdefault(name, {})
        phases[name][kind] = phases[name].get(kind, 0) + 1 / ranks
    return phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--saves", type=int, default=2)
    ap.add_argument("--store", choices=["local", "s3"], default="local")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.ranks, args.init, args.base, args.tensors, args.saves)
        return
    tmp = tempfile.mkdtemp(prefix="bench_scale_gloo-")
    env_cm: Any = contextlib.nullcontext()
    proxy = None
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if args.store == "s3":
            import logging

            from s3_server import Proxy, moto_environment

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            env_cm = moto_environment()
            moto = stack.enter_context(env_cm)
            proxy = Proxy(moto.port)
            stack.callback(proxy.close)
            env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
            base = f"s3://{moto.bucket()}/run"
        else:
            base = os.path.join(tmp, "run")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
        common = [f"--ranks={args.ranks}", f"--tensors={args.tensors}", f"--saves={args.saves}"]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *common, f"--rank={r}", f"--init={tmp}/init"]
                + [f"--base={base}"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(args.ranks)
        ]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a rank failed: {[p.returncode for p in procs]}")
        phases = _phases(proxy.requests(), args.ranks) if proxy is not None else {}
    for line in outs[0].splitlines():
        if not line.startswith("RESULT "):
            continue
        row = json.loads(line[len("RESULT ") :])
        name = row["path"] + (f"-{row['save']}" if "save" in row else "")
        req = phases.get(name)
        cells = " ".join(f"{k}={v:.3f}" for k, v in row.items() if isinstance(v, float))
        print(f"{name:16s} {cells}" + (f" requests/rank={req}" if req else ""), flush=True)


if __name__ == "__main__":
    main()
