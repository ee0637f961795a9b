"""A tiny accelerate training loop (dropout, shuffled data, AdamW + StepLR, one
``register_for_checkpointing`` object), in-process or as a child:

    python -m integration_helpers.accel_run KIND ROOT EPOCHS [RESUME] [; KIND ROOT ...]

KIND is ``shardpoint``, ``shardpoint-async``, ``shardpoint-compressed`` (the weights in the
part), ``shardpoint-tiers`` (the multi-tier checkpoints: ROOT/nvme the local tier, every
epoch; ROOT/tiers the persistent one, every 2; ``save_state()``/``load_state()`` without a
directory; ``shardpoint-tiers-nodes``: each process its own node, ``ROOT/node-<RANK>``) or
``native``. ``save_state()`` after every epoch (4 steps) with
automatic naming under ROOT/checkpoints; RESUME is a checkpoint directory or ``latest``.
Prints one JSON line: per run, the losses (hex floats), a digest of the final parameters and
the custom object's state.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from integration_helpers.common import arm_kill_hook, digest, exit_rank, hexes


class Progress:
    """A registered object: epochs done and a running mean of the loss (a tensor)."""

    def __init__(self) -> None:
        self.epochs = 0
        self.mean = torch.zeros(())

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "mean": self.mean.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs = int(state["epochs"])
        self.mean = state["mean"].clone()


def train(
    kind: str, root: str, epochs: int, resume: str | None = None, total_limit: int | None = None
) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    set_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.2), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 8, generator=g)
    ds = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).cos())
    dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    cls: Any = Accelerator
    if kind != "native":
        # imported only here: a `native` run is a plain accelerate script (the user's next one)
        from shardpoint.integrations.accelerate import ShardpointAccelerator

        cls = ShardpointAccelerator
    kw: dict[str, Any] = {"shardpoint_blocking": False} if kind == "shardpoint-async" else {}
    if kind == "shardpoint-compressed":
        kw["shardpoint_weights"] = "compressed"
    if kind.startswith("shardpoint-tiers"):
        node = f"node-{os.environ.get('RANK', '0')}" if kind.endswith("-nodes") else "nvme"
        kw["shardpoint_local_directory"] = f"{root}/{node}"
        kw["shardpoint_tiers"] = {"local_every": 1, "persistent_every": 2}
    acc = cls(
        **kw,
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=root, automatic_checkpoint_naming=True, total_limit=total_limit
        ),
    )
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    tier_step = None
    if resume is not None:
        tier_step = acc.load_state(None if resume == "latest" else resume)
        acc.project_configuration.iteration = progress.epochs
    losses = []
    for _ in range(progress.epochs, epochs):
        model.train()
        for xb, yb in dl:
            loss = F.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(loss.item())
            # the mean over processes: accelerate saves a registered object from process 0
            # only, so its state must be the same on every process
            progress.mean = progress.mean * 0.9 + acc.reduce(loss.detach(), "mean") * 0.1
        progress.epochs += 1
        acc.save_state()
    if hasattr(acc, "wait_for_saves"):  # shardpoint_blocking=False: the last write
        acc.wait_for_saves()
    tiers = getattr(acc, "shardpoint_tiers", None)
    plan = tiers.restore_plan if tiers is not None else None
    if tiers is not None:
        # (end_training() would too, but it also destroys the process group the next run of
        # this process needs)
        tiers.close()
    return {
        "tier_step": tier_step,
        "tiers": [s.tier for s in plan.sources] if plan is not None else None,
        "losses": hexes(losses),
        "digest": digest(acc.unwrap_model(model).state_dict()),
        "progress": [progress.epochs, float(progress.mean).hex()],
        "step": acc.step,
    }


def main(argv: list[str]) -> None:
    arm_kill_hook()
    results = []
    job: list[str] = []
    for arg in [*argv, ";"]:
        if arg != ";":
            job.append(arg)
            continue
        results.append(train(job[0], job[1], int(job[2]), job[3] if len(job) > 3 else None))
        job = []
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_rank()  # DDP keeps the gloo group alive into finalization (exit_rank)
