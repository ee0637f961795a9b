"""A tiny Hugging Face Trainer run (GPT-2 from a config, dropout on), in-process or as a child:

    python -m integration_helpers.hf_run KIND OUT MAX_STEPS [RESUME] [; KIND OUT ...]

KIND is ``native`` or ``shardpoint`` with options joined by ``-``: ``async``
(``shardpoint_blocking=False``), ``compressed`` (``shardpoint_weights="compressed"``),
``sharded`` (a 20 kB ``shardpoint_max_shard_size``); a ``peft-`` prefix trains a LoRA adapter
(PEFT) on the model; ``tiers`` turns the multi-tier checkpoints on (``OUT/nvme`` the local
tier, every 2 steps; ``OUT/tiers`` the persistent one, every 4; no ``checkpoint-N``), and
``tiers-nodes`` makes each process of a multi-process job its own node (``OUT/node-<RANK>``).
Checkpoints every 3 steps under OUT; RESUME is a checkpoint directory or ``true`` (the last
one). ``SP_TEST_STOP_AT=N`` stops training after step N (a job stopped before ``MAX_STEPS``,
its schedule that of ``MAX_STEPS``). Prints one JSON line: per run, the per-step losses (hex
floats), a digest of the final parameters, and with ``tiers`` the step resumed from the tiers
and each rank's tier.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import torch

from integration_helpers.common import arm_kill_hook, digest, exit_rank, hexes

SAVE_STEPS = 3
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def make_model() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    return GPT2LMHeadModel(cfg)


def dataset(n: int = 40) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 64, (n, 16), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def recording_trainer() -> type:
    from transformers import Trainer

    class Recording(Trainer):
        """Records every micro-batch loss exactly (logged losses are rounded)."""

        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            out = super().compute_loss(model, inputs, *args, **kwargs)
            loss = out[0] if isinstance(out, tuple) else out
            if model.training:
                self.recorded.append(loss.item())
            return out

    return Recording


#: the ``shardpoint_max_shard_size`` of the ``sharded`` kind: the tiny model spans several files
SHARD_BYTES = 20_000


def peft_model() -> Any:
    """The tiny GPT-2 with a LoRA adapter on its attention (PEFT), adapter dropout on."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["c_attn"])
    return get_peft_model(make_model(), config)


def build(
    kind: str, out: str, max_steps: int, trainer_kw: dict[str, Any] | None = None, **extra: Any
) -> Any:
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=out,
        max_steps=max_steps,
        save_steps=SAVE_STEPS,
        save_strategy=extra.pop("save_strategy", "steps"),
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        warmup_steps=2,
        logging_steps=1,
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )
    cls = recording_trainer()
    kw: dict[str, Any] = {}
    options = kind.split("-")
    model = peft_model() if options[0] == "peft" else make_model()
    if "shardpoint" in options:
        # imported only here: a `native` run is a plain Trainer script (the user's next one)
        from shardpoint.integrations.hf_trainer import with_shardpoint

        cls = with_shardpoint(cls)
        kw["shardpoint_blocking"] = "async" not in options
        if "compressed" in options:
            kw["shardpoint_weights"] = "compressed"
        if "sharded" in options:
            kw["shardpoint_max_shard_size"] = SHARD_BYTES
        if "tiers" in options:
            node = f"node-{os.environ.get('RANK', '0')}" if "nodes" in options else "nvme"
            kw["shardpoint_local_directory"] = os.path.join(out, node)
            kw["shardpoint_tiers"] = {"local_every": 2, "persistent_every": 4}
    if "eval_strategy" in extra:
        kw["eval_dataset"] = dataset(8)
    kw.update(trainer_kw or {})
    trainer = cls(model=model, args=args, train_dataset=dataset(), **kw)
    stop_at = int(os.environ.get("SP_TEST_STOP_AT", "0"))
    if stop_at:
        from transformers import TrainerCallback

        class Stop(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step >= stop_at:
                    control.should_training_stop = True

        trainer.add_callback(Stop())
    trainer.recorded = []
    return trainer


def train(kind: str, out: str, max_steps: int, resume: Any = None, **extra: Any) -> dict[str, Any]:
    if "tiers" in kind.split("-"):
        extra.setdefault("save_strategy", "no")
    trainer = build(kind, out, max_steps, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    out_: dict[str, Any] = {
        "losses": hexes(trainer.recorded),
        "digest": digest(trainer.model.state_dict()),
        "global_step": trainer.state.global_step,
    }
    tiers = getattr(trainer, "shardpoint_tiers", None)
    if tiers is not None:
        plan = tiers.restore_plan
        out_["tier_step"] = tiers.restored_step
        out_["tiers"] = [s.tier for s in plan.sources] if plan is not None else None
    return out_


def main(argv: list[str]) -> None:
    arm_kill_hook()
    results = []
    job: list[str] = []
    for arg in [*argv, ";"]:
        if arg != ";":
            job.append(arg)
            continue
        resume: Any = job[3] if len(job) > 3 else None
        results.append(train(job[0], job[1], int(job[2]), True if resume == "true" else resume))
        job = []
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    # gloo's threads must not meet the interpreter's exit: under load a rank aborted there
    # after printing its results ("terminate called without an active exception", exit -6),
    # as in ds_run; the Trainer's DDP model keeps the group past destroy_process_group
    exit_rank()
