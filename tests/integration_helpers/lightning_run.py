"""A tiny Lightning training run, in-process or as a child:

    python -m integration_helpers.lightning_run IO ROOT EPOCHS [RESUME] [; IO ROOT ...]

IO is ``shardpoint``, ``shardpoint-async`` (our ``blocking=False``), ``lightning-async``
(Lightning's ``AsyncCheckpointIO`` around ours) or ``native`` (Lightning's own). Every epoch
(4 steps) ``ModelCheckpoint`` saves ``ROOT/ckpts/epoch=E-step=S.ckpt`` and ``last.ckpt``.
RESUME is a checkpoint path or ``last``. Several runs separated by ``;`` share the process.
Prints one JSON line: per run, the losses of the steps it took (hex floats) and a digest of
the final parameters.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from integration_helpers.common import arm_kill_hook, digest, exit_rank, hexes

STEPS_PER_EPOCH = 4


def _lightning() -> Any:
    import lightning.pytorch as pl

    return pl


pl = _lightning()
from shardpoint.integrations.lightning import ShardpointLoadable  # noqa: E402


class PlainNet(pl.LightningModule):
    """The run's module, a plain ``LightningModule`` (module level: spawn strategies pickle
    it by name)."""

    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.losses.append(loss.item())
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Net(ShardpointLoadable, PlainNet):
    """The same module with the ``ShardpointLoadable`` mixin."""


def make_module(hidden: int = 16, lr: float = 0.05) -> Any:
    torch.manual_seed(0)
    return Net(hidden=hidden, lr=lr)


def loader() -> Any:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * STEPS_PER_EPOCH, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False)


def plugins(io: str) -> list[Any]:
    from shardpoint.integrations.lightning import ShardpointCheckpointIO

    if io == "native":
        return []
    if io == "shardpoint":
        return [ShardpointCheckpointIO()]
    if io == "shardpoint-async":
        return [ShardpointCheckpointIO(blocking=False)]
    if io == "lightning-async":
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        return [AsyncCheckpointIO(ShardpointCheckpointIO())]
    raise ValueError(io)


def train(
    io: str,
    root: str,
    epochs: int,
    resume: str | None = None,
    save_top_k: int = -1,
    strategy: Any = "auto",
    devices: int = 1,
) -> dict[str, Any]:
    """Fit to ``epochs`` epochs (resuming from ``resume``); losses and final digest, and
    the rank of this process (``strategy="ddp"`` runs this function in every process)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    model = make_module()
    ckpt = ModelCheckpoint(
        dirpath=f"{root}/ckpts",
        every_n_epochs=1,
        save_top_k=save_top_k,
        monitor="train_loss" if save_top_k > 0 else None,
        save_last=True,
        save_on_train_epoch_end=True,
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ckpt],
        plugins=plugins(io),
        default_root_dir=root,
        deterministic=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, loader(), ckpt_path=resume)
    return {
        "losses": hexes(model.losses),
        "digest": digest(model.state_dict()),
        "global_step": trainer.global_step,
        "rank": trainer.global_rank,
    }


from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from lightning.pytorch.strategies.launchers.multiprocessing import (  # noqa: E402
    _MultiProcessingLauncher,
)


class ExitingLauncher(_MultiProcessingLauncher):
    """Lightning's spawn launcher whose workers end through ``exit_rank`` once their work is
    handed back (module level: the workers unpickle it by name). Lightning never destroys a
    gloo group, and the DDP model keeps the group's threads running into the worker's
    interpreter finalization, where under load they abort it (exit_rank says how). A worker
    that fails still exits through torch's own error path, with its error."""

    def _wrapping_function(self, *args: Any, **kwargs: Any) -> None:
        super()._wrapping_function(*args, **kwargs)
        exit_rank()


class SpawnStrategy(DDPStrategy):
    """``strategy="ddp_spawn"`` (the same strategy) launched by ``ExitingLauncher``."""

    def __init__(self) -> None:
        super().__init__(start_method="spawn")

    def _configure_launcher(self) -> None:
        self._launcher = ExitingLauncher(self, start_method="spawn")


def main(argv: list[str]) -> None:
    arm_kill_hook()
    results = []
    job: list[str] = []
    for arg in [*argv, ";"]:
        if arg != ";":
            job.append(arg)
            continue
        io, root, epochs = job[0], job[1], int(job[2])
        results.append(train(io, root, epochs, job[3] if len(job) > 3 else None))
        job = []
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
