"""GPU serving-load benchmark (issue 34): the same files loaded onto one CUDA device by
``sptorch.weights_iterator(device="cuda")``, ``safetensors.safe_open(device="cuda")``,
fastsafetensors (GDS off: ``nogds=True``; on where the machine has it with ``--gds``), and
transformers' ``from_pretrained(device_map="cuda")`` beside ``shardpoint.hf.from_pretrained``;
cold (page cache evicted) and warm; GPU memory peak (``max_memory_allocated``) and host peak
RSS above the process's start.

Needs a CUDA GPU, torch, safetensors, transformers, fastsafetensors. Not run in CI (no GPU there).

    .venv/bin/python benches/bench_serving_gpu.py [--out DIR] [--layers 16] [--rounds 2]

The model is a Llama built from a config (no download: ``--layers`` x hidden 2048, ~1 GB per 4
layers in bf16), saved with ``save_pretrained`` (a Hugging Face directory) and exported with
``shardpoint export`` (uncompressed and default codec). Each run is a fresh process.
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
from typing import Any

GB = 1e9
LOADERS = ["sp_iter_default", "sp_iter_none", "sp_iter_hf", "safe_open_cuda", "fastsafetensors",
           "hf_from_pretrained", "sp_from_pretrained"]  # fmt: skip


def setup(out: Path, layers: int) -> None:
    if (out / "DONE").exists():
        return
    import torch
    import transformers

    from shardpoint.convert.serving import export_serving

    cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=layers, num_attention_heads=16,
                                   num_key_value_heads=4, vocab_size=32000)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out / "hf")
    del model
    export_serving(str(out / "hf"), str(out / "sp_default"))
    export_serving(str(out / "hf"), str(out / "sp_none"), compression="none")
    os.sync()
    (out / "DONE").write_text("ok")


def evict(d: Path) -> None:
    from bench_load import evict as drop  # the tests' helper (tests/page_cache.py)

    drop([str(p) for p in d.rglob("*") if p.is_file()])


def warm(d: Path) -> None:
    for p in d.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass


def child(name: str, out: Path) -> None:
    import torch

    torch.cuda.init()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.cuda.reset_peak_memory_stats()
    n = 0
    t0 = time.perf_counter()
    if name.startswith("sp_iter"):
        import shardpoint.torch as spt

        path = {"sp_iter_default": out / "sp_default" / "model",
                "sp_iter_none": out / "sp_none" / "model", "sp_iter_hf": out / "hf"}[name]  # fmt: skip
        kept = {}
        for k, t in spt.weights_iterator(str(path), device="cuda"):
            kept[k] = t
            n += t.numel() * t.element_size()
    elif name == "safe_open_cuda":
        from safetensors import safe_open

        kept = {}
        for f in sorted((out / "hf").glob("*.safetensors")):
            with safe_open(str(f), framework="pt", device="cuda") as s:
                for k in s.keys():  # noqa: SIM118
                    kept[k] = s.get_tensor(k)
                    n += kept[k].numel() * kept[k].element_size()
    elif name == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        ld = SafeTensorsFileLoader(SingleGroup(), "cuda:0", nogds="--gds" not in sys.argv)
        ld.add_filenames({0: [str(f) for f in sorted((out / "hf").glob("*.safetensors"))]})
        fb = ld.copy_files_to_device()
        kept = {k: fb.get_tensor(k).clone() for k in fb.key_to_rank_lidx}
        n = sum(t.numel() * t.element_size() for t in kept.values())
        fb.close()
        ld.close()
    else:
        import transformers

        if name == "hf_from_pretrained":
            m = transformers.AutoModelForCausalLM.from_pretrained(out / "hf", device_map="cuda")
        else:
            import shardpoint.hf as sphf

            m = sphf.from_pretrained(
                transformers.AutoModelForCausalLM, str(out / "sp_default"), device_map="cuda"
            )
        n = sum(p.numel() * p.element_size() for p in m.parameters())
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({
        "seconds": dt, "bytes": n, "gpu_peak": torch.cuda.max_memory_allocated(),
        "host_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base,
    }))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench-out/serving-gpu"))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gds", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args()
    out = args.out.resolve()
    if args.child:
        child(args.child, out)
        return
    setup(out, args.layers)
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for mode in ("cold", "warm"):
            for name in LOADERS:
                (evict if mode == "cold" else warm)(out)
                cmd = [sys.executable, __file__, "--child", name, "--out", str(out)]
                r = subprocess.run(cmd + (["--gds"] if args.gds else []), capture_output=True,
                                   text=True)  # fmt: skip
                got = (json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                       else {"error": r.stderr.strip().splitlines()[-1][:160]})  # fmt: skip
                res.setdefault((mode, name), []).append(got)
                print(mode, name, got, flush=True)
    print("\nmode  loader               best GB/s (median)  GPU peak GB  host peak GB")
    for (mode, name), rs in res.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            print(f"{mode:5s} {name:20s} {rs[0]['error']}")
            continue
        g = [r["bytes"] / r["seconds"] / GB for r in ok]
        print(f"{mode:5s} {name:20s} {max(g):8.2f} ({statistics.median(g):.2f})  "
              f"{max(r['gpu_peak'] for r in ok) / GB:10.2f}  "
              f"{max(r['host_peak'] for r in ok) / GB:11.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
