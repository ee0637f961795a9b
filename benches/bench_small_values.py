"""Many small values lying end to end (issue 41, runs read with one ``preadv``): 20,000
values of 2 KiB, as a safetensors file read in place (``read_ranges_into``) and as an
uncompressed shardpoint file (``Reader.load_into``, crc checked), warm, best of 7 reads per
process; and, best of 3 per process, a serving engine's loop over them: ``safe_open`` +
``get_tensor`` per key (the reference) against ``sptorch.weights_iterator`` over the same
safetensors file and over the shardpoint checkpoint (target: the iterator within 1.1x of the
reference's time). This tree against an older package (``--before``), rounds interleaved.

    .venv/bin/python benches/bench_small_values.py --before DIR [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
COUNT, SIZE = 20_000, 2048


def child(out: Path) -> None:
    """Print [GB/s of the safetensors ranges, GB/s of the shardpoint load_into]."""
    import numpy as np

    import shardpoint as sp
    from shardpoint.storage import read_ranges_into

    path = str(out / "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    spans = sorted(
        (8 + n + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
        for k, v in header.items()
        if k != "__metadata__"
    )
    outs = [np.ones(m, np.uint8) for _, m in spans]
    ranges = [(0, o) for o, _ in spans]
    st_best = min(_timed(lambda: read_ranges_into([path], ranges, outs)) for _ in range(7))
    with sp.open(str(out / "ck")) as r:
        targets = {k: np.ones(r.info(k).shape, np.uint8) for k in r.keys()}
        sp_best = min(_timed(lambda: r.load_into(targets)) for _ in range(7))
    total = sum(m for _, m in spans)
    print(json.dumps([total / 1e9 / st_best, total / 1e9 / sp_best, *_loops(out)]))


def _loops(out: Path) -> list[float]:
    """Seconds of the engine's loop (best of 3): ``safe_open``, then the weights iterator over
    the safetensors file and over the shardpoint checkpoint."""
    import torch
    from safetensors import safe_open

    import shardpoint.torch as sptorch

    path = str(out / "model.safetensors")

    def reference() -> None:
        with safe_open(path, "pt") as f:
            for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                f.get_tensor(k)

    def ours(src: str) -> Callable[[], None]:
        def run() -> None:
            n = 0
            for _, t in sptorch.weights_iterator(src):
                n += t.numel()
            assert n == COUNT * SIZE

        return run

    torch.set_num_threads(1)
    return [
        min(_timed(f) for _ in range(3)) for f in (reference, ours(path), ours(str(out / "ck")))
    ]


def _timed(f: Callable[[], object]) -> float:
    """Seconds one call of ``f`` takes."""
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/spbench-small"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, required=False)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.out)
        return
    import numpy as np
    from safetensors.numpy import save_file

    sys.path.insert(0, str(HERE.parent / "python"))
    import shardpoint as sp

    if not (args.out / "ck").exists():
        args.out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(41)
        st = {f"t{i:05d}": rng.integers(0, 255, SIZE, dtype=np.uint8) for i in range(COUNT)}
        save_file(st, str(args.out / "model.safetensors"))
        sp.save_file(st, str(args.out / "ck"), compression="none", durable=False)
    trees = {"this tree": HERE.parent / "python"}
    if args.before:
        trees["before"] = args.before
    print(f"{COUNT} values of {SIZE} bytes, warm; load average={os.getloadavg()}")
    got: dict[str, list[list[float]]] = {}
    for rnd in range(args.rounds):
        for name, pkg in trees.items():
            env = dict(os.environ, PYTHONPATH=str(pkg))
            cmd = [sys.executable, __file__, "--child", "--out", str(args.out)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            v = json.loads(r.stdout.strip().splitlines()[-1])
            got.setdefault(name, []).append(v)
            print(f"  round {rnd + 1} {name}: safetensors ranges {v[0]:.2f} GB/s, "
                  f"shardpoint load_into {v[1]:.2f} GB/s; loops: safe_open {v[2]:.3f} s, "
                  f"iterator (safetensors) {v[3]:.3f} s, iterator (shardpoint) {v[4]:.3f} s",
                  flush=True)  # fmt: skip
    print(
        "\n| tree | safetensors ranges GB/s | shardpoint load_into GB/s | iterator / safe_open "
        "loop, safetensors file | the same, shardpoint checkpoint |\n|---|---|---|---|---|"
    )
    for name, vs in got.items():
        a, b = [x[0] for x in vs], [x[1] for x in vs]
        hf, own = [x[3] / x[2] for x in vs], [x[4] / x[2] for x in vs]
        print(
            f"| {name} | {max(a):.2f} ({statistics.median(a):.2f}) | "
            f"{max(b):.2f} ({statistics.median(b):.2f}) | "
            f"{min(hf):.2f}x ({statistics.median(hf):.2f}x) | "
            f"{min(own):.2f}x ({statistics.median(own):.2f}x) |"
        )
    print(f"load average at the end={os.getloadavg()}")


if __name__ == "__main__":
    main()
