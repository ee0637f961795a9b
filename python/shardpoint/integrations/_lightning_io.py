"""The Lightning ``CheckpointIO`` subclass (imports Lightning; reached through
``shardpoint.integrations.lightning.ShardpointCheckpointIO``)."""

from __future__ import annotations

import os
import shutil
from argparse import Namespace
from typing import Any

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
except ImportError:  # the standalone pytorch_lightning distribution
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO

from ._state import PendingSaves, part_prefix, save_tree
from .lightning import _NAME, _PART, load_checkpoint

__all__ = ["ShardpointCheckpointIO"]


class ShardpointCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that saves through shardpoint:
    ``Trainer(plugins=[ShardpointCheckpointIO()])``.

    Each checkpoint path Lightning chooses becomes a directory holding one shardpoint
    checkpoint (``state.index`` + ``state.data-*``), committed by the index's atomic rename.

    Args:
        blocking: ``False`` returns from ``save_checkpoint`` once the state is snapshotted
            (tensors copied into reused host buffers, in parallel); compression, write and
            commit run in the background, and ``load_checkpoint``/``remove_checkpoint`` of that
            path and ``teardown`` wait for them (re-raising a failed save's error).
        compression, level, durable: as :func:`shardpoint.torch.save`.

    Also works wrapped in Lightning's ``AsyncCheckpointIO(ShardpointCheckpointIO())``.
    """

    def __init__(
        self,
        *,
        blocking: bool = True,
        compression: str | None = "zstd",
        level: int | None = None,
        durable: bool = True,
    ) -> None:
        super().__init__()
        self.blocking = blocking
        self.compression = compression
        self.level = level
        self.durable = durable
        self._pending = PendingSaves()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save Lightning's checkpoint dict as directory ``path``."""
        if storage_options is not None:
            raise TypeError(
                "ShardpointCheckpointIO.save_checkpoint takes no storage_options; pass "
                "compression/level/durable to ShardpointCheckpointIO(...)"
            )
        directory = os.fspath(path)
        if os.path.isfile(directory):  # a native .ckpt file of the same name: replace it
            os.remove(directory)
        self._pending.wait(directory)  # two saves to one path commit in call order
        hparams = checkpoint.get("hyper_parameters")
        if isinstance(hparams, Namespace):
            # stored as its dict: Lightning turns it back into a Namespace on load, from the
            # "hparams_type" entry it saves beside it
            checkpoint = {**checkpoint, "hyper_parameters": dict(vars(hparams))}
        fut = save_tree(
            checkpoint,
            part_prefix(directory, _PART),
            integration=_NAME,
            blocking=self.blocking,
            compression=self.compression,
            level=self.level,
            durable=self.durable,
        )
        if fut is not None:
            self._pending.add(directory, fut)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint dict saved at ``path``. ``weights_only`` (torch.load's unpickling
        restriction) has nothing to restrict: nothing is unpickled."""
        self._pending.wait(os.fspath(path))
        return load_checkpoint(path, map_location)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete checkpoint directory ``path`` (``ModelCheckpoint``'s ``save_top_k`` rotation)."""
        directory = os.fspath(path)
        self._pending.wait(directory)
        if os.path.isdir(directory) and not os.path.islink(directory):
            shutil.rmtree(directory)
        elif os.path.lexists(directory):
            os.remove(directory)

    def teardown(self) -> None:
        """Wait for every background save (Lightning calls this at the end of fit)."""
        self._pending.wait()

    def wait(self) -> None:
        """Block until every ``blocking=False`` save has committed (raises a failed one's error)."""
        self._pending.wait()
