"""The Lightning callback that turns the multi-tier checkpoints on (imports Lightning; reached
through ``shardpoint.integrations.lightning.ShardpointTiers``).

Lightning's model: ``ModelCheckpoint`` decides *when and where* a checkpoint file goes, the
``CheckpointIO`` plugin *how* it is written, and ``trainer.fit(ckpt_path=...)`` resumes. The
tiers decide where by themselves (a part per rank, in three tiers) and resume by a collective
over the job's process group, which exists only once ``fit`` has set up the strategy. So they
are a callback of their own, beside ``ModelCheckpoint``:

- ``setup`` (``fit``; the process group exists, nothing is restored yet): build the
  :class:`~shardpoint.tiers.TieredCheckpointManager` and restore the newest complete step
  from the cheapest tier; Lightning's dict from it is handed to the trainer's checkpoint
  connector, which restores the module, callbacks, optimizers, schedulers and loops from it
  exactly as for ``fit(ckpt_path=...)`` (a ``ckpt_path`` given to ``fit`` wins);
- ``on_train_batch_end``: ``manager.save(trainer.global_step)``: the whole dict Lightning's
  own checkpoints hold (``dump_checkpoint``), copied into host buffers, the rest in the
  background; due every ``local_every`` optimizer steps, every ``persistent_every`` also to
  the persistent tier;
- ``teardown``: wait for the saves in flight and stop the manager's threads.

The checkpoint connector's ``_loaded_checkpoint`` is Lightning's private attribute (tested on
the installed release: tests/integrations/test_lightning_tiers.py).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone pytorch_lightning distribution
    from pytorch_lightning.callbacks import Callback

from ..tiers import TieredCheckpointManager
from ._state import WRITER_KEY

__all__ = ["ShardpointTiers"]


class _TrainerState:
    """What the tiered manager saves and restores: Lightning's whole checkpoint dict, as a
    shardpoint checkpoint (prefix form: a tier part is a prefix)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.loaded: dict[str, Any] | None = None

    def write(self, prefix: str, blocking: bool = True, compression: str | None = None) -> Any:
        from .. import torch as sptorch

        state = self.trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        return sptorch.save(
            state,
            prefix,
            blocking=blocking,
            compression=compression,
            single_file=False,
            metadata={WRITER_KEY: "lightning-tiers"},
        )

    def restore(self, prefix: str, verify: bool = True) -> None:
        from .. import torch as sptorch

        self.loaded = dict(sptorch.load(prefix, map_location="cpu", verify=verify))


class ShardpointTiers(Callback):
    """Multi-tier checkpoints for a Lightning run:
    ``Trainer(callbacks=[ShardpointTiers("s3://bucket/run", local_directory="/dev/shm/ckpt")])``.

    Every ``local_every`` optimizer steps the full training state (what Lightning's own
    checkpoints hold: module, optimizers, schedulers, loops, callbacks) goes to
    ``local_directory`` (node-local: tmpfs or NVMe) and to ``replicas`` other nodes; every
    ``persistent_every`` steps also to ``directory`` (a path or an ``s3://``, ``gs://``,
    ``az://`` URL), written in the background. ``fit`` resumes by itself from the newest step
    complete in any tier (a replaced node's parts come from its peers). The other arguments are
    :class:`shardpoint.TieredCheckpointManager`'s (docs/TIERS.md). Each rank saves what its
    ``dump_checkpoint`` returns (DDP and single-device strategies).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        local_directory: str | os.PathLike[str],
        local_every: int = 10,
        persistent_every: int = 1000,
        replicas: int = 1,
        replication_jump: int | None = None,
        max_to_keep: int | None = 5,
        local_max_to_keep: int = 2,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        super().__init__()
        self._options: dict[str, Any] = {
            "local_directory": local_directory,
            "local_every": local_every,
            "persistent_every": persistent_every,
            "replicas": replicas,
            "replication_jump": replication_jump,
            "max_to_keep": max_to_keep,
            "local_max_to_keep": local_max_to_keep,
            "timeout": timeout,
        }
        self.directory = directory
        self.manager: TieredCheckpointManager | None = None
        #: the step ``fit`` resumed from (None: started fresh)
        self.restored_step: int | None = None
        #: where each rank's part came from (``shardpoint.tiers.RestorePlan``; None: no restore)
        self.restore_plan: Any = None
        self._last_step: int | None = None

    @property
    def state_key(self) -> str:
        return f"ShardpointTiers{{directory={os.fspath(self.directory)!r}}}"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.manager is not None:
            return
        state = _TrainerState(trainer)
        self.manager = TieredCheckpointManager(state, self.directory, **self._options)
        self.restored_step = self.manager.restore_or_initialize()
        self.restore_plan = self.manager.restore_plan()
        self._last_step = self.restored_step
        if state.loaded is not None:
            loaded: dict[str, Any] = state.loaded
            try:
                from lightning.pytorch.utilities.migration.utils import _pl_migrate_checkpoint

                loaded = _pl_migrate_checkpoint(loaded, None)
            except ImportError:
                pass
            # restored with the module, callbacks, optimizers and loops by fit itself, as a
            # checkpoint fit(ckpt_path=...) loaded (resume_start(None) keeps it)
            trainer._checkpoint_connector._loaded_checkpoint = loaded
            state.loaded = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if self.manager is None or step <= 0 or step == self._last_step:
            # gradient accumulation: no optimizer step (yet, or since the last call); step 0
            # would count as due (0 % k == 0) though nothing was trained
            return
        self._last_step = step
        self.manager.save(step)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self.manager is not None:
            manager, self.manager = self.manager, None
            manager.close()
