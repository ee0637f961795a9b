"""The Lightning ``CheckpointIO`` subclass (imports Lightning; reached through
``shardpoint.integrations.lightning.ShardpointCheckpointIO``)."""

from __future__ import annotations

import os
import shutil
import sys
from argparse import Namespace
from types import FrameType
from typing import Any

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch import LightningModule
    from lightning.pytorch.strategies import Strategy
except ImportError:  # the standalone pytorch_lightning distribution
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
    from pytorch_lightning import LightningModule
    from pytorch_lightning.strategies import Strategy

from ._state import PendingSaves, module_targets, part_prefix, save_tree
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
        module = self._restoring_module(sys._getframe(1))
        into = None
        if module is not None:
            targets = module_targets(module)
            into = {"state_dict": targets} if targets is not None else None
        return load_checkpoint(path, map_location, into=into)

    def _restoring_module(self, frame: FrameType | None) -> Any:
        """The ``LightningModule`` whose weights the checkpoint being loaded restores, when
        Lightning is sure to write every stored weight into it unchanged, else None.

        A ``CheckpointIO`` is never told which trainer it serves; the strategy that calls
        ``load_checkpoint`` is (``Strategy.load_checkpoint``, directly or through a wrapping
        IO such as ``AsyncCheckpointIO``): looked up on the few frames above this call. It
        then restores with ``Strategy.load_model_state_dict`` (``module.load_state_dict``),
        after the module's ``on_load_checkpoint`` hook, which may edit the checkpoint: only
        a strategy that keeps both base methods and a module without that hook qualify.
        Anything else (another caller, strategy or version) loads fresh tensors as before."""
        for _ in range(3):
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            if isinstance(owner, Strategy):
                io = owner._checkpoint_io
                if io is not self and getattr(io, "checkpoint_io", None) is not self:
                    return None
                cls = type(owner)
                module = owner.lightning_module
                plain = (
                    cls.load_checkpoint is Strategy.load_checkpoint
                    and cls.load_model_state_dict is Strategy.load_model_state_dict
                    and isinstance(module, LightningModule)
                    and type(module).on_load_checkpoint is LightningModule.on_load_checkpoint
                )
                return module if plain else None
            frame = frame.f_back
        return None

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
