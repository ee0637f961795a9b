"""A job of WORLD real ranks (spawned processes, gloo on 127.0.0.1) running a tiered manager.

``run_job(tmp, script, ...)`` starts the ranks; each runs ``script`` (a list of actions) and
writes what it saw to ``<tmp>/out-<rank>.json``. Node ``n`` of the job is the local directory
``<tmp>/node-<n>`` (ranks ``n * per_node ..``). Every rank's state is a function of (rank,
step), so a restore is checked exactly: the values must be those saved at the restored step,
on every rank, for one step.

Actions: ``["save", [steps...]]`` (then ``wait``), ``["restore"]``.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import multiprocessing.forkserver
import os
import time
import traceback
from typing import Any

from rank_rendezvous import rendezvous_env

WORLD = 4
PER_NODE = 2


def state_of(rank: int, step: int, n: int, noise: bool = False) -> Any:
    """Rank ``rank``'s state at ``step``: a ramp, or (``noise``) incompressible values."""
    import numpy as np

    if noise:
        return np.random.default_rng(rank * 100003 + step).standard_normal(n, dtype=np.float32)
    return (np.arange(n, dtype=np.float32) * (rank + 1) + step).astype(np.float32)


def _rank_main(rank: int, port: int, tmp: str, script: list[Any], cfg: dict[str, Any]) -> None:
    os.environ.update(cfg.get("env", {}))
    if cfg.get("fault") and rank in cfg.get("fault_ranks", [rank]):
        os.environ["SHARDPOINT_TIERS_FAULT"] = cfg["fault"]
    out: dict[str, Any] = {"rank": rank, "events": []}
    path = os.path.join(tmp, f"out-{rank}.json")
    try:
        import numpy as np
        import torch.distributed as dist

        import shardpoint as sp

        # a client of the store this job's parent serves (rank_rendezvous)
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True"
        )
        dist.init_process_group(
            "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60)
        )
        n = int(cfg.get("n", 1000))
        w = sp.Variable(np.zeros(n, dtype=np.float32))
        step_var = sp.Variable(np.int64(-1))
        ckpt = sp.Checkpoint(w=w, step=step_var)
        m = sp.TieredCheckpointManager(
            ckpt,
            cfg["persistent"],
            local_directory=os.path.join(tmp, f"node-{rank // PER_NODE}"),
            local_every=cfg.get("local_every", 10),
            persistent_every=cfg.get("persistent_every", 20),
            replicas=cfg.get("replicas", 1),
            timeout=datetime.timedelta(seconds=20),
        )
        for action in script:
            if action[0] == "save":
                for step in action[1]:
                    w.assign(state_of(rank, step, n, bool(cfg.get("noise"))))
                    step_var.assign(np.int64(step))
                    t0 = time.perf_counter()
                    m.save(step)
                    out["events"].append(["saved", step, time.perf_counter() - t0])
                m.wait()
                out["events"].append(["waited"])
            elif action[0] == "restore":
                w.assign(np.zeros(n, dtype=np.float32))
                step_var.assign(np.int64(-1))
                dist.barrier()
                t0 = time.perf_counter()
                got = m.restore_or_initialize()
                seconds = time.perf_counter() - t0
                plan = m.restore_plan()
                exact = got is not None and bool(
                    int(step_var.numpy()) == got
                    and np.array_equal(w.numpy(), state_of(rank, got, n, bool(cfg.get("noise"))))
                )
                out["events"].append(
                    [
                        "restored",
                        got,
                        exact,
                        seconds,
                        None if plan is None else [s.tier for s in plan.sources],
                        None if plan is None else plan.excluded,
                    ]
                )
            _dump(path, out)
        m.close()
        dist.destroy_process_group()
        _dump(path, out)
    except BaseException:
        out["error"] = traceback.format_exc()
        _dump(path, out)
        os._exit(5)


def _dump(path: str, out: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, path)


_PRELOAD = ["numpy", "torch", "torch.distributed", "shardpoint", "tiers_helpers.job"]


#: pid of the fork server this module started (with _PRELOAD), once it has
_OUR_SERVER: list[int | None] = [None]


def _context() -> Any:
    """Ranks forked from one server process that imported torch once (a spawned rank spends
    seconds importing it; a forked one starts at once). Fork-safe: the server holds no
    process group and no shardpoint thread pools (they are built per process, on first use).

    A process has one fork server, and its preload list only counts when it starts. When an
    earlier test in this process started it without ours (a ``DataLoader`` with forkserver
    workers: tests/storage/test_reader_pickle.py runs before the tiers tests in the serial
    group), every rank imported torch itself: a job took tens of seconds instead of one. Such
    a server is stopped here (the next job starts ours); its earlier children are
    independent processes and keep running. ``_stop`` and ``_forkserver_pid`` are CPython's
    own (its tests use them); without them the ranks are only slower."""
    ctx = multiprocessing.get_context("forkserver")
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None and pid != _OUR_SERVER[0] and hasattr(server, "_stop"):
        server._stop()
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _remember_server() -> None:
    _OUR_SERVER[0] = getattr(
        getattr(multiprocessing.forkserver, "_forkserver", None), "_forkserver_pid", None
    )


def run_job(
    tmp: str, script: list[Any], cfg: dict[str, Any], timeout: float = 90.0
) -> tuple[list[int | None], list[dict[str, Any]]]:
    """Run WORLD ranks of ``script``; their exit codes (None: still running at the timeout,
    killed here) and outputs (``{}`` for a rank that wrote none)."""
    for r in range(WORLD):
        try:
            os.unlink(os.path.join(tmp, f"out-{r}.json"))
        except FileNotFoundError:
            pass
    ctx = _context()
    with rendezvous_env() as rendezvous:
        port = int(rendezvous["MASTER_PORT"])
        procs = [
            ctx.Process(target=_rank_main, args=(r, port, tmp, script, cfg)) for r in range(WORLD)
        ]
        for p in procs:
            p.start()
        _remember_server()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
    codes: list[int | None] = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            codes.append(None)
        else:
            codes.append(p.exitcode)
    outs = []
    for r in range(WORLD):
        try:
            with open(os.path.join(tmp, f"out-{r}.json")) as f:
                outs.append(json.load(f))
        except FileNotFoundError:
            outs.append({})
    return codes, outs
