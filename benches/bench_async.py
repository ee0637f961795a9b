"""Asynchronous and incremental saves (issue 13): how long a training loop is blocked per save.

Not a test: it prints figures measured side by side in one run.

    .venv/bin/python benches/bench_async.py [--mb 1024] [--steps 12] [--every 3] [--out DIR]

State: a torch MLP on CPU (``--mb`` MB of fp32 in weights + Adam moments, layers of 1024x1024)
trained with Adam. Reported:

1. stall per save: the wall time the training thread spends inside the save call, for a
   blocking ``shardpoint.torch.save``, ``blocking=False``, ``CheckpointManager.save(blocking=False)``,
   ``dcp.async_save`` with DCP's ``FileSystemWriter`` and with our ``StorageWriter``,
   ``torch.save``, and one single-threaded memcpy of the whole state into preallocated memory.
   Asynchronous stalls are the median over warm saves (the first save allocates its staging
   memory); each asynchronous save is waited for before the next method runs.
2. steps/s of the training loop with no saves and with an asynchronous save every ``--every``
   steps (the stall includes waiting for the previous save: one save in flight at most).
3. incremental: 90% of the bytes frozen (the first layers do not train: no gradients, no Adam
   state), bytes written and time of a durable save, incremental vs full, and the restore of
   both compared bit for bit.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402

MB = 1 << 20
D = 1024  # layer width


def make_net(
    mb: int, frozen_fraction: float = 0.0
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP whose weights + Adam moments are about ``mb`` MB (with ``frozen_fraction`` of the
    bytes in frozen layers, which have no Adam state)."""
    layer_mb = D * (D + 1) * 4 / MB
    if frozen_fraction:
        # frozen F layers (1x), trainable T layers (3x with Adam): F / (F + 3T) = fraction
        t = max(1, round(mb / layer_mb * (1 - frozen_fraction) / 3))
        f = max(1, round(3 * t * frozen_fraction / (1 - frozen_fraction)))
    else:
        t, f = max(1, round(mb / (3 * layer_mb))), 0
    torch.manual_seed(0)
    layers = []
    for i in range(f + t):
        lin = torch.nn.Linear(D, D)
        lin.requires_grad_(i >= f)
        layers += [lin, torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=1e-4)
    return net, opt


def train_step(net: torch.nn.Module, opt: torch.optim.Optimizer, batch: int) -> None:
    x = torch.randn(batch, D)
    opt.zero_grad(set_to_none=True)
    net(x).square().mean().backward()
    opt.step()


def state_of(net: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": net.state_dict(), "optim": opt.state_dict()}


def tensors_of(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_of(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_of(v)]
    return []


def state_bytes(state: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(state))


def memcpy_time(state: Any) -> float:
    """One single-threaded copy of every tensor into preallocated (warm) memory, best of 3."""
    srcs = [t.detach().numpy().reshape(-1) for t in tensors_of(state)]
    dsts = [np.empty_like(s) for s in srcs]
    for d in dsts:
        d.fill(0)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for s, d in zip(srcs, dsts, strict=True):
            np.copyto(d, s)
        best = min(best, time.perf_counter() - t0)
    return best


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def dir_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def files_of(prefix: str) -> list[str]:
    d, b = os.path.split(prefix)
    return [os.path.join(d, n) for n in os.listdir(d) if n.startswith(b + ".")]


def new_bytes(prefix: str, previous: str | None) -> int:
    """Bytes of ``prefix``'s files that are not hard links of ``previous``'s files."""
    seen = set()
    if previous is not None:
        seen = {os.stat(p).st_ino for p in files_of(previous)}
    return sum(os.path.getsize(p) for p in files_of(prefix) if os.stat(p).st_ino not in seen)


def stall_methods(net, opt, work: str, saves: int) -> dict[str, list[float]]:
    """Stall per save for each method, on the same (trained) state."""
    import torch.distributed.checkpoint as dcp

    state = state_of(net, opt)
    out: dict[str, list[float]] = {}

    def blocking(i: int) -> float:
        return timed(lambda: spt.save(state, f"{work}/blk", blocking=True))[0]

    def sp_async(i: int) -> float:
        t, fut = timed(lambda: spt.save(state, f"{work}/asy", blocking=False))
        train_step(net, opt, 8)  # the state changes under the background write
        fut.result()
        return t

    ck = sp.Checkpoint(model=net, optimizer=opt)
    mgr = sp.CheckpointManager(ck, f"{work}/mgr", max_to_keep=2)

    def mgr_async(i: int) -> float:
        t, fut = timed(lambda: mgr.save(blocking=False))
        train_step(net, opt, 8)
        fut.result()
        return t

    def dcp_fs(i: int) -> float:
        w = dcp.FileSystemWriter(f"{work}/dcpfs-{i}")
        t, fut = timed(lambda: dcp.async_save(state_of(net, opt), storage_writer=w))
        train_step(net, opt, 8)
        fut.result()
        shutil.rmtree(f"{work}/dcpfs-{i}", ignore_errors=True)
        return t

    def dcp_sp(i: int) -> float:
        w = spt.StorageWriter(f"{work}/dcpsp-{i}")
        t, fut = timed(lambda: dcp.async_save(state_of(net, opt), storage_writer=w))
        train_step(net, opt, 8)
        fut.result()
        sp.remove(f"{work}/dcpsp-{i}")
        return t

    def tsave(i: int) -> float:
        return timed(lambda: torch.save(state, f"{work}/t.pt"))[0]

    methods = {
        "shardpoint blocking save (durable)": blocking,
        "shardpoint blocking=False": sp_async,
        "CheckpointManager.save(blocking=False)": mgr_async,
        "dcp.async_save + FileSystemWriter": dcp_fs,
        "dcp.async_save + sp StorageWriter": dcp_sp,
        "torch.save (no fsync)": tsave,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, fn in methods.items():
            times = []
            for i in range(saves):
                gc.collect()
                times.append(fn(i))
            out[name] = times
            print(f"  {name:42s} " + " ".join(f"{t:6.3f}" for t in times), flush=True)
    return out


def loop(net, opt, steps: int, every: int, batch: int, save: Callable[[int], Any] | None):
    """Train ``steps`` steps, saving every ``every``; returns (seconds, stalls)."""
    stalls = []
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        train_step(net, opt, batch)
        if save is not None and s % every == 0:
            t1 = time.perf_counter()
            save(s)
            stalls.append(time.perf_counter() - t1)
    return time.perf_counter() - t0, stalls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024, help="state size in MB (weights + Adam)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--saves", type=int, default=3, help="saves per method for the stall table")
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        help="batch size (0: chosen so a step takes about as long as a blocking save)",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    work = a.out or tempfile.mkdtemp(prefix="bench_async-")
    os.makedirs(work, exist_ok=True)
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"work dir {work}"
    )
    try:
        run(a, work)
    finally:
        if a.out is None:
            shutil.rmtree(work, ignore_errors=True)


def run(a: argparse.Namespace, work: str) -> None:
    net, opt = make_net(a.mb)
    train_step(net, opt, 8)  # create the Adam state
    state = state_of(net, opt)
    nbytes = state_bytes(state)
    print(f"state: {nbytes / MB:.0f} MB in {len(tensors_of(state))} tensors")

    # -- 1. stall per save --------------------------------------------------------------------
    mc = memcpy_time(state)
    print(f"one memcpy of the state (single thread): {mc:.3f} s ({nbytes / mc / 1e9:.2f} GB/s)")
    print("stall per save, seconds (each save):")
    stalls = stall_methods(net, opt, work, a.saves)

    def med(ts: list[float], warm: bool) -> float:
        return statistics.median(ts[1:] if warm and len(ts) > 1 else ts)

    dcp_stall = med(stalls["dcp.async_save + FileSystemWriter"], True)
    print("\nmethod                                      stall s   x memcpy   x dcp.async_save(FS)")
    for name, ts in stalls.items():
        warm = "False" in name or "async" in name
        m = med(ts, warm)
        print(f"{name:42s} {m:8.3f}   {m / mc:8.2f}   {m / dcp_stall:8.2f}")

    # -- 2. steps/s with and without async saves -----------------------------------------------
    blk = med(stalls["shardpoint blocking save (durable)"], False)
    batch = a.batch
    if not batch:  # a step about as long as a blocking save
        t1, _ = loop(net, opt, 2, 10**9, 64, None)
        per = t1 / 2
        batch = max(8, int(64 * blk / per))
    print(f"\ntraining loop: batch {batch}, {a.steps} steps, a save every {a.every} steps")
    t_none, _ = loop(net, opt, a.steps, a.every, batch, None)
    ck = sp.Checkpoint(model=net, optimizer=opt)
    mgr = sp.CheckpointManager(ck, f"{work}/loop", max_to_keep=2)
    t_async, st_async = loop(net, opt, a.steps, a.every, batch, lambda s: mgr.save(blocking=False))
    mgr.wait()
    t_blk, st_blk = loop(net, opt, a.steps, a.every, batch, lambda s: mgr.save())
    import torch.distributed.checkpoint as dcp

    pending: list[Any] = []

    def dcp_save(s: int) -> None:
        if pending:
            pending.pop().result()
        w = dcp.FileSystemWriter(f"{work}/dcploop-{s}")
        pending.append(dcp.async_save(state_of(net, opt), storage_writer=w))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_dcp, st_dcp = loop(net, opt, a.steps, a.every, batch, dcp_save)
        if pending:
            pending.pop().result()
    print(f"  no saves:                       {a.steps / t_none:6.3f} steps/s")
    print(
        f"  manager.save(blocking=False):   {a.steps / t_async:6.3f} steps/s "
        f"({t_none / t_async:.0%} of no saves), stalls {', '.join(f'{x:.3f}' for x in st_async)}"
    )
    print(
        f"  manager.save() blocking:        {a.steps / t_blk:6.3f} steps/s "
        f"({t_none / t_blk:.0%}), stalls {', '.join(f'{x:.3f}' for x in st_blk)}"
    )
    print(
        f"  dcp.async_save(FileSystemWriter): {a.steps / t_dcp:6.3f} steps/s "
        f"({t_none / t_dcp:.0%}), stalls {', '.join(f'{x:.3f}' for x in st_dcp)}"
    )
    mgr = ck = state = None  # free the first model before building the second
    gc.collect()

    # -- 3. incremental with 90% frozen ----------------------------------------------------------
    net, opt = make_net(a.mb, frozen_fraction=0.9)
    train_step(net, opt, 8)
    st = state_of(net, opt)
    frozen = sum(p.numel() * 4 for p in net.parameters() if not p.requires_grad)
    print(f"\nincremental: {state_bytes(st) / MB:.0f} MB, {frozen / state_bytes(st):.0%} frozen")
    mgrs = {
        inc: sp.CheckpointManager(
            sp.Checkpoint(model=net, optimizer=opt),
            f"{work}/inc-{inc}",
            max_to_keep=2,
            incremental=inc,
        )
        for inc in (False, True)
    }
    for m in mgrs.values():
        m.save()  # first save: full either way
    times: dict[bool, list[float]] = {False: [], True: []}
    written: dict[bool, list[int]] = {False: [], True: []}
    for _ in range(3):
        train_step(net, opt, 8)
        for inc, m in mgrs.items():  # the same state saved both ways
            prev = m.latest_checkpoint
            gc.collect()
            os.sync()
            t, path = timed(m.save)
            times[inc].append(t)
            written[inc].append(new_bytes(path, prev))
    res = {
        inc: (min(times[inc]), statistics.median(written[inc]), mgrs[inc].latest_checkpoint)
        for inc in (False, True)
    }
    (tf, bf, pf), (ti, bi, pi) = res[False], res[True]
    print(f"  full save:        {tf:7.3f} s, {bf / MB:8.1f} MB written")
    print(
        f"  incremental save: {ti:7.3f} s, {bi / MB:8.1f} MB written "
        f"({bi / bf:.1%} of the bytes, {ti / tf:.1%} of the time)"
    )
    a_full, a_inc = sp.load_file(pf), sp.load_file(pi)
    same = set(a_full) == set(a_inc) and all(
        (np.asarray(a_full[k]).tobytes() == np.asarray(a_inc[k]).tobytes())
        if isinstance(a_full[k], np.ndarray)
        else a_full[k] == a_inc[k]
        for k in a_full
    )
    print(f"  restore of the incremental checkpoint equals the full one bit for bit: {same}")


if __name__ == "__main__":
    main()
