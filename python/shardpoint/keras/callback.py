"""``ShardpointCheckpoint``: a Keras callback saving the model and its optimizer through a
:class:`~shardpoint.CheckpointManager` every N batches or every epoch, in the background.

In the spirit of ``keras.callbacks.OrbaxCheckpoint``, with shardpoint's object-based format:
the checkpoint is an ``sp.Checkpoint(model=..., optimizer=..., **objects)``, keys named as
TensorFlow names them, restorable with ``sp.Checkpoint(...).restore`` into an unbuilt model
(deferred restore) or resumed by the callback itself (``restore=True``).
"""

from __future__ import annotations

import os
from typing import Any

import keras

from ..objgraph.checkpoint import Checkpoint
from ..objgraph.load_status import CheckpointLoadStatus
from ..objgraph.manager import CheckpointManager
from ..objgraph.variables import Variable

__all__ = ["ShardpointCheckpoint"]


class ShardpointCheckpoint(keras.callbacks.Callback):
    """Save ``model`` (and ``model.optimizer``) every ``save_freq`` batches or each epoch.

    Args:
        directory: where the numbered checkpoints (``ckpt-N``) and the ``checkpoint`` state file
            go (a local path or an object-store URL).
        save_freq: ``"epoch"`` or a number of batches.
        max_to_keep: checkpoints kept (oldest deleted first); None keeps all.
        blocking: False (default) saves asynchronously: values are copied to host memory at the
            end of the batch and written while training continues (at most one save in flight;
            the next one, and ``on_train_end``, wait for it). True writes before returning.
        save_optimizer: include ``model.optimizer`` (its iterations, learning rate, moments).
        restore: at the start of training, restore the latest checkpoint of ``directory`` if
            there is one (values of layers or optimizer slots not built yet land when they
            are built), so an interrupted ``fit`` resumes where it stopped saving.
        objects: further trackables saved beside the model (a data iterator with
            ``state_dict()``, an ``sp.Variable`` ...), by name.

    The checkpoint number is the number of batches trained (``step`` in the checkpoint). On the
    JAX backend the trainer keeps variables outside the model between steps; they are synced
    back (``model.jax_state_sync()``) before each save.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        save_freq: str | int = "epoch",
        max_to_keep: int | None = 5,
        *,
        blocking: bool = False,
        save_optimizer: bool = True,
        restore: bool = False,
        objects: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if save_freq != "epoch" and not (isinstance(save_freq, int) and save_freq > 0):
            raise ValueError(f"save_freq must be 'epoch' or a positive int, got {save_freq!r}")
        self.directory = os.fspath(directory)
        self.save_freq = save_freq
        self.max_to_keep = max_to_keep
        self.blocking = blocking
        self.save_optimizer = save_optimizer
        self.restore = restore
        self.objects = dict(objects or {})
        self.step = Variable(0, dtype="int64", name="step", trainable=False)
        self.checkpoint: Checkpoint | None = None
        self.manager: CheckpointManager | None = None
        self.restore_status: CheckpointLoadStatus | None = None
        self._batches_since_save = 0

    # -- setup ---------------------------------------------------------------------------------
    def _ensure_manager(self) -> CheckpointManager:
        if self.manager is None:
            deps: dict[str, Any] = {"model": self.model, "step": self.step}
            optimizer = getattr(self.model, "optimizer", None)
            if self.save_optimizer and optimizer is not None:
                deps["optimizer"] = optimizer
            deps.update(self.objects)
            self.checkpoint = Checkpoint(**deps)
            self.manager = CheckpointManager(
                self.checkpoint, self.directory, max_to_keep=self.max_to_keep
            )
        return self.manager

    def on_train_begin(self, logs: Any = None) -> None:
        manager = self._ensure_manager()
        if self.restore and manager.latest_checkpoint is not None:
            assert self.checkpoint is not None
            status = self.checkpoint.restore(manager.latest_checkpoint)
            assert isinstance(status, CheckpointLoadStatus)
            self.restore_status = status

    # -- saving --------------------------------------------------------------------------------
    def _save(self) -> None:
        manager = self._ensure_manager()
        sync = getattr(self.model, "jax_state_sync", None)
        if callable(sync):
            sync()  # the JAX trainer holds the current values outside the variables
        manager.wait()  # at most one save in flight: its staging memory is reused
        manager.save(checkpoint_number=int(self.step), blocking=self.blocking)
        self._batches_since_save = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.step.assign_add(1)
        if self.save_freq == "epoch":
            return
        self._batches_since_save += 1
        if self._batches_since_save >= int(self.save_freq):
            self._save()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.save_freq == "epoch":
            self._save()

    def on_train_end(self, logs: Any = None) -> None:
        if self.manager is not None:
            self.manager.wait()  # every save committed (or its error raised) before fit returns

    def wait(self) -> None:
        """Block until every checkpoint saved so far is committed."""
        if self.manager is not None:
            self.manager.wait()
