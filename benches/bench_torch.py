"""PyTorch benchmark: shardpoint.torch beside torch.save/load, safetensors and DCP, in one run.

Not a test: it prints a table of figures measured side by side (issue 5 lists the targets).

    .venv/bin/python benches/bench_torch.py [--scale 1.0] [--out DIR]

Model: ``make_model`` of ``bench_storage.py`` (~1 GB fp32, ~200 tensors) as torch tensors, and
its bf16 cast. Timings are best-of-N wall times with a warm page cache; "load" is load + touch
one byte of every page of every tensor (what a training job does before its first step), so
lazy/mmap loaders pay for their page faults. Saves that do not fsync (torch.save, safetensors)
are compared with ``durable=False``; DCP's FileSystemWriter fsyncs by default and is compared
with our StorageWriter's default (durable, zstd-compressed, crc32c-checksummed).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402
from bench_storage import make_model  # noqa: E402

GB = 1e9


def best(fn: Callable[[], object], repeat: int) -> float:
    """Best-of-``repeat`` wall time (the machine is shared: the best run is the most stable)."""
    t_best = float("inf")
    for _ in range(repeat):
        gc.collect()
        os.sync()  # write back earlier runs' dirty pages first: they would throttle this one
        t0 = time.perf_counter()
        fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best


def touch(tensors: dict) -> int:
    """Read one byte per 4 KiB page of every tensor (faults mmapped pages in)."""
    s = 0
    for t in tensors.values():
        if isinstance(t, torch.Tensor) and t.numel():
            s += int(t.reshape(-1).view(torch.uint8)[::4096].sum())
    return s


def size_of(path: str) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return sum(f.stat().st_size for f in p.parent.glob(p.name + "*") if f.is_file())


def clear(path: str) -> None:
    p = Path(path)
    if p.is_dir():
        shutil.rmtree(p)
    else:
        for f in p.parent.glob(p.name + "*"):
            f.unlink()


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, ...]] = []

    def add(self, *cells: object) -> None:
        self.rows.append(tuple(str(c) for c in cells))
        print("  ".join(self.rows[-1]), file=sys.stderr, flush=True)

    def show(self) -> None:
        widths = [max(len(r[i]) for r in self.rows) for i in range(len(self.rows[0]))]
        for j, row in enumerate(self.rows):
            print("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
            if j == 0:
                print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def bench(label: str, model: dict[str, torch.Tensor], work: str, table: Table, repeat: int) -> dict:
    import safetensors.torch as st
    import torch.distributed.checkpoint as dcp

    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    res: dict[str, float] = {}

    def row(name: str, seconds: float, path: str | None = None, base: str | None = None) -> None:
        res[name] = seconds
        ratio = f"{res[base] / seconds:.2f}x" if base and base in res else ""
        size = f"{size_of(path) / 1e6:.0f}" if path else ""
        table.add(label, name, f"{seconds:.3f}", f"{nbytes / seconds / GB:.2f}", size, ratio)

    pt, sfp = os.path.join(work, "m.pt"), os.path.join(work, "m.safetensors")
    p_none, p_z = os.path.join(work, "sp_none"), os.path.join(work, "sp_zstd")

    # -- save ---------------------------------------------------------------------------------
    row("torch.save", best(lambda: torch.save(model, pt), repeat), pt)
    row("safetensors save_file", best(lambda: st.save_file(model, sfp), repeat), sfp, "torch.save")
    row(
        "sp.torch.save none durable=False",
        best(lambda: spt.save(model, p_none, compression="none", durable=False), repeat),
        p_none,
        "torch.save",
    )
    row(
        "sp.torch.save zstd durable=False",
        best(lambda: spt.save(model, p_z, durable=False), repeat),
        p_z,
        "torch.save",
    )
    row(
        "sp.torch.save zstd durable=True",
        best(lambda: spt.save(model, p_z, durable=True), repeat),
        p_z,
        "torch.save",
    )

    # -- load + touch every page (warm) -----------------------------------------------------------
    row("torch.load(mmap=True)+touch", best(lambda: touch(torch.load(pt, mmap=True)), repeat))
    row(
        "safetensors load_file+touch",
        best(lambda: touch(st.load_file(sfp)), repeat),
        None,
        "torch.load(mmap=True)+touch",
    )
    row(
        "sp.torch.load none verify=False+touch",
        best(lambda: touch(spt.load(p_none, verify=False)), repeat),
        None,
        "torch.load(mmap=True)+touch",
    )
    row(
        "sp.torch.load none verify=True+touch",
        best(lambda: touch(spt.load(p_none)), repeat),
        None,
        "torch.load(mmap=True)+touch",
    )
    row(
        "sp.torch.load zstd+touch",
        best(lambda: touch(spt.load(p_z)), repeat),
        None,
        "torch.load(mmap=True)+touch",
    )
    # -- into existing tensors (a model's own memory): no fresh output memory, no second copy --
    into = {k: torch.empty_like(v) for k, v in model.items()}
    for t in into.values():
        t.zero_()  # a model's memory is touched already
    row(
        "sp.torch.load_into zstd",
        best(lambda: spt.load_into(into, p_z), repeat),
        None,
        "sp.torch.load zstd+touch",
    )
    assert all(torch.equal(into[k], v) for k, v in model.items())
    row(
        "sp.torch.load_into none verify=True",
        best(lambda: spt.load_into(into, p_none), repeat),
        None,
        "sp.torch.load none verify=True+touch",
    )
    into.clear()
    for p in (pt, sfp, p_none, p_z):
        clear(p)

    # -- DCP: default FileSystemWriter vs our StorageWriter (single process) ------------------------
    d_fs, d_sp = os.path.join(work, "dcp_fs"), os.path.join(work, "dcp_sp", "ckpt")

    def dcp_fs() -> None:
        clear(d_fs)
        dcp.save(model, storage_writer=dcp.FileSystemWriter(d_fs))

    row("DCP save FileSystemWriter (fsync)", best(dcp_fs, repeat), d_fs)
    row(
        "DCP save sp StorageWriter zstd (fsync)",
        best(lambda: dcp.save(model, storage_writer=spt.StorageWriter(d_sp)), repeat),
        d_sp,
        "DCP save FileSystemWriter (fsync)",
    )
    row(
        "DCP save sp StorageWriter none (fsync)",
        best(
            lambda: dcp.save(model, storage_writer=spt.StorageWriter(d_sp, compression="none")),
            repeat,
        ),
        d_sp,
        "DCP save FileSystemWriter (fsync)",
    )
    target = {k: torch.empty_like(v) for k, v in model.items()}
    row(
        "DCP load FileSystemReader",
        best(lambda: dcp.load(target, storage_reader=dcp.FileSystemReader(d_fs)), repeat),
    )
    row(
        "DCP load sp StorageReader (none)",
        best(lambda: dcp.load(target, storage_reader=spt.StorageReader(d_sp)), repeat),
        None,
        "DCP load FileSystemReader",
    )
    clear(d_fs)
    clear(os.path.dirname(d_sp))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="model size factor (1.0 = ~1 GB)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # DCP's single-process notices
    work = args.out or tempfile.mkdtemp(prefix="sp-bench-torch-")
    os.makedirs(work, exist_ok=True)
    print(f"torch {torch.__version__}, shardpoint {sp.__version__}, {os.cpu_count()} CPUs, {work}")
    t0 = time.perf_counter()
    fp32 = {k: torch.from_numpy(v) for k, v in make_model(scale=args.scale).items()}
    table = Table()
    table.add("model", "operation", "time s", "GB/s", "file MB", "speedup vs ref")
    results = {"fp32": bench("fp32", fp32, work, table, args.repeat)}
    bf16 = {k: v.to(torch.bfloat16) for k, v in fp32.items()}
    del fp32
    results["bf16"] = bench("bf16", bf16, work, table, args.repeat)
    print()
    table.show()
    print("\nTargets (speedup = reference time / our time):")
    for label, r in results.items():
        save_vs_torch = r["torch.save"] / r["sp.torch.save zstd durable=False"]
        save_vs_st = r["safetensors save_file"] / r["sp.torch.save zstd durable=False"]
        save_vs_st_none = r["safetensors save_file"] / r["sp.torch.save none durable=False"]
        load = r["torch.load(mmap=True)+touch"] / r["sp.torch.load none verify=False+touch"]
        load_v = r["torch.load(mmap=True)+touch"] / r["sp.torch.load none verify=True+touch"]
        dcp_x = r["DCP save FileSystemWriter (fsync)"] / r["DCP save sp StorageWriter zstd (fsync)"]
        print(
            f"  {label}: save(zstd) vs torch.save {save_vs_torch:.2f}x (target >= 3); "
            f"save(zstd) vs safetensors {save_vs_st:.2f}x, save(none) vs safetensors "
            f"{save_vs_st_none:.2f}x (target >= 1); load+touch vs torch.load(mmap) "
            f"{load:.2f}x verify=False, {load_v:.2f}x verify=True (target >= 1); "
            f"DCP sp(zstd) vs FileSystemWriter {dcp_x:.2f}x (target >= 2)"
        )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; shared machine: figures are noisy")
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
