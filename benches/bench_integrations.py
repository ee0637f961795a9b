"""Trainer integrations: shardpoint vs each framework's own checkpointing, side by side.

Not a test: prints one table. For Lightning, the Hugging Face Trainer, accelerate and DeepSpeed
(ZeRO-1, CPU, gloo), a ~100M-parameter model with AdamW is trained 2 steps, then saved
``--saves`` times by the trainer's own save call, then resumed once:

* blocked: wall time of the trainer's save call (what training waits for), mean per save;
* total: until the checkpoint is committed (blocked + background write for async saves);
* resume: restoring the trainer from the checkpoint (the framework's resume call);
* bytes: size on disk of one checkpoint.

    .venv/bin/python benches/bench_integrations.py [--params 100e6] [--saves 2] [--only NAME]

Our saves are durable (fsync) and zstd-compressed, as by default; the native ones are
``torch.save``/safetensors without fsync. The Hugging Face Trainer and accelerate keep the
weights as the framework's safetensors files by default (uncompressed: what serving reads);
their ``compressed`` rows store them in the shardpoint part too (``shardpoint_weights=
"compressed"``). DeepSpeed's ``blocking=False`` row is its decoupled protocol: the save call
returns after the snapshot; "total" includes the commit DeepSpeed runs at the next step.
Page cache warm, a shared machine: figures vary.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROWS: list[dict[str, Any]] = []


def du(path: Path) -> int:
    """Bytes of a checkpoint: a file, or every file under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def record(
    framework: str,
    variant: str,
    blocked: list[float],
    total: list[float],
    resume: float,
    nbytes: int,
) -> None:
    row = dict(
        framework=framework,
        variant=variant,
        blocked=sum(blocked) / len(blocked),
        total=sum(total) / len(total),
        resume=resume,
        bytes=nbytes,
    )
    ROWS.append(row)
    print(
        f"  {framework:12s} {variant:36s} blocked {row['blocked']:7.2f} s  total "
        f"{row['total']:7.2f} s  resume {resume:7.2f} s  {nbytes / 1e9:6.3f} GB  (blocked per "
        f"save: {', '.join(f'{b:.2f}' for b in blocked)}; the first one also allocates buffers)",
        flush=True,
    )


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def mlp(params: float) -> torch.nn.Module:
    """Square Linear layers, ~``params`` parameters."""
    width = 2048
    layers = max(1, round(params / (width * width + width)))
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


# ------------------------------------------------------------------------------- Lightning


def bench_lightning(params: float, saves: int, root: Path) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    from shardpoint.integrations.lightning import ShardpointCheckpointIO

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(params)

        def training_step(self, batch: Any, idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(4, 2048)), batch_size=2
    )

    def trainer(io: Any, steps: int) -> Any:
        return pl.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[io] if io is not None else [],
        )

    variants = {
        "native (TorchCheckpointIO)": lambda: TorchCheckpointIO(),
        "native AsyncCheckpointIO": lambda: AsyncCheckpointIO(TorchCheckpointIO()),
        "shardpoint": lambda: ShardpointCheckpointIO(),
        "shardpoint blocking=False": lambda: ShardpointCheckpointIO(blocking=False),
        "AsyncCheckpointIO(shardpoint)": lambda: AsyncCheckpointIO(ShardpointCheckpointIO()),
    }
    model = Net()
    for name, make in variants.items():
        io = make()
        t = trainer(io, 2)
        t.fit(model, data)
        blocked, total = [], []
        for i in range(saves):
            path = root / name.replace(" ", "_") / f"s{i}.ckpt"
            start = time.perf_counter()
            t.save_checkpoint(path)
            blocked.append(time.perf_counter() - start)
            io_impl = t.strategy.checkpoint_io
            if hasattr(io_impl, "wait"):
                io_impl.wait()
            elif isinstance(io_impl, AsyncCheckpointIO):
                io_impl.teardown()
            total.append(time.perf_counter() - start)
        nbytes = du(path)
        t2 = trainer(make(), 2)
        resume = timed(lambda: t2.fit(Net(), data, ckpt_path=str(path)))  # noqa: B023
        record("lightning", name, blocked, total, resume, nbytes)
        shutil.rmtree(root / name.replace(" ", "_"))
        gc.collect()


# ------------------------------------------------------------------------------- HF Trainer


def gpt2(params: float) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    # one block of width 768 is ~7.1M parameters; vocab 8192 adds ~6.3M
    layers = max(1, round((params - 6.3e6) / 7.08e6))
    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=8192, n_positions=64, n_embd=768, n_layer=layers, n_head=12)
    )


def bench_hf(params: float, saves: int, root: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from shardpoint.integrations.hf_trainer import with_shardpoint

    ids = torch.randint(0, 8192, (8, 32), generator=torch.Generator().manual_seed(0))
    ds = [{"input_ids": r, "labels": r} for r in ids]

    def build(cls: Any, out: Path, steps: int, **kw: Any) -> Any:
        args = TrainingArguments(
            output_dir=str(out),
            max_steps=steps,
            save_strategy="no",
            per_device_train_batch_size=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            save_only_model=False,
        )
        return cls(model=gpt2(params), args=args, train_dataset=ds, **kw)

    ours = with_shardpoint(Trainer)
    packed = {"shardpoint_weights": "compressed"}
    variants = {
        "native Trainer": (Trainer, {}),
        "ShardpointTrainer": (ours, {}),
        "ShardpointTrainer async": (ours, {"shardpoint_blocking": False}),
        "ShardpointTrainer compressed": (ours, packed),
        "ShardpointTrainer compressed async": (ours, {**packed, "shardpoint_blocking": False}),
    }
    for name, (cls, kw) in variants.items():
        out = root / name.replace(" ", "_")
        trainer = build(cls, out, 2, **kw)
        trainer.train()
        blocked, total = [], []
        for _ in range(saves):
            shutil.rmtree(out / "checkpoint-2", ignore_errors=True)
            start = time.perf_counter()
            trainer._save_checkpoint(trainer.model, None)  # what Trainer calls at save steps
            blocked.append(time.perf_counter() - start)
            pending = getattr(trainer, "_sp_pending", None)
            if pending is not None:
                pending.wait()
            total.append(time.perf_counter() - start)
        nbytes = du(out / "checkpoint-2")
        again = build(cls, out, 2, **kw)
        resume = timed(lambda: again.train(resume_from_checkpoint=str(out / "checkpoint-2")))  # noqa: B023
        record("hf_trainer", name, blocked, total, resume, nbytes)
        shutil.rmtree(out)
        gc.collect()


# ------------------------------------------------------------------------------- accelerate


def bench_accelerate(params: float, saves: int, root: Path) -> None:
    from accelerate import Accelerator

    from shardpoint.integrations.accelerate import ShardpointAccelerator

    packed = {"shardpoint_weights": "compressed"}
    variants = (
        ("native Accelerator", Accelerator, {}),
        ("ShardpointAccelerator", ShardpointAccelerator, {}),
        ("ShardpointAccelerator async", ShardpointAccelerator, {"shardpoint_blocking": False}),
        ("ShardpointAccelerator compressed", ShardpointAccelerator, packed),
        (
            "ShardpointAccelerator compr. async",
            ShardpointAccelerator,
            {**packed, "shardpoint_blocking": False},
        ),
    )
    for name, cls, kw in variants:
        acc = cls(cpu=True, **kw)
        model = mlp(params)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt = acc.prepare(model, opt)
        for _ in range(2):
            acc.backward(model(torch.randn(2, 2048)).pow(2).mean())
            opt.step()
            opt.zero_grad()
        out = root / name.replace(" ", "_")
        blocked, total = [], []
        for i in range(saves):
            start = time.perf_counter()
            acc.save_state(str(out / f"s{i}"))
            blocked.append(time.perf_counter() - start)
            if hasattr(acc, "wait_for_saves"):
                acc.wait_for_saves()
            total.append(time.perf_counter() - start)
        nbytes = du(out / f"s{saves - 1}")
        resume = timed(lambda: acc.load_state(str(out / f"s{saves - 1}")))  # noqa: B023
        record("accelerate", name, blocked, total, resume, nbytes)
        shutil.rmtree(out)
        gc.collect()


# ------------------------------------------------------------------------------- DeepSpeed


def bench_deepspeed(params: float, saves: int, root: Path) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29671")
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    import deepspeed

    from shardpoint.integrations.deepspeed import use_shardpoint

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    cfg = {
        "train_batch_size": 2,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
    }

    def engine(ours: dict[str, Any] | None) -> Any:
        model = mlp(params)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        return use_shardpoint(eng, **ours) if ours is not None else eng

    variants = (
        ("native engine", None),
        ("ShardpointCheckpointEngine", {}),
        ("ShardpointCheckpointEngine blocking=False", {"blocking": False}),
    )
    for name, ours in variants:
        eng = engine(ours)
        for _ in range(2):
            eng.backward(eng(torch.randn(2, 2048)).pow(2).mean())
            eng.step()
        out = root / name.replace(" ", "_")
        blocked, total = [], []
        for i in range(saves):
            start = time.perf_counter()
            eng.save_checkpoint(str(out), tag=f"t{i}")
            blocked.append(time.perf_counter() - start)
            if eng.checkpoint_engine.is_decoupled():  # what DeepSpeed runs at the next step
                eng._commit_decoupled_checkpoint()
            total.append(time.perf_counter() - start)
        nbytes = du(out / f"t{saves - 1}")
        again = engine(ours)
        resume = timed(lambda: again.load_checkpoint(str(out), tag=f"t{saves - 1}"))  # noqa: B023
        record("deepspeed", name, blocked, total, resume, nbytes)
        shutil.rmtree(out)
        gc.collect()


BENCHES = {
    "lightning": bench_lightning,
    "hf_trainer": bench_hf,
    "accelerate": bench_accelerate,
    "deepspeed": bench_deepspeed,
}
NATIVE = {
    "lightning": "native (TorchCheckpointIO)",
    "hf_trainer": "native Trainer",
    "accelerate": "native Accelerator",
    "deepspeed": "native engine",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--saves", type=int, default=2)
    ap.add_argument("--only", choices=sorted(BENCHES), action="append")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    root = Path(a.out or tempfile.mkdtemp(prefix="bench-integrations-"))
    print(
        f"~{a.params / 1e6:.0f}M parameters + AdamW, {a.saves} saves, torch threads "
        f"{torch.get_num_threads()}, {os.cpu_count()} cpus, under {root}"
    )
    for name in a.only or list(BENCHES):
        BENCHES[name](a.params, a.saves, root)
    print(
        "\nratios to the native row of each framework (targets: blocked <= 0.5 for background "
        "saves, resume <= 1.0, bytes <= 0.9 with the weights as safetensors files and <= 0.85 "
        "with them compressed or, for Lightning and DeepSpeed, always)"
    )
    print(
        f"{'framework':12s} {'variant':36s} {'blocked':>8s} {'total':>8s} {'resume':>8s} "
        f"{'bytes':>8s}"
    )
    for row in ROWS:
        base = next(
            r
            for r in ROWS
            if r["framework"] == row["framework"] and r["variant"] == NATIVE[row["framework"]]
        )
        ratio = {
            k: row[k] / base[k] if base[k] else math.nan
            for k in ("blocked", "total", "resume", "bytes")
        }
        print(
            f"{row['framework']:12s} {row['variant']:36s} {ratio['blocked']:8.2f} "
            f"{ratio['total']:8.2f} {ratio['resume']:8.2f} {ratio['bytes']:8.2f}"
        )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
