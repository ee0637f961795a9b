"""The Lightning ``CheckpointIO`` subclass (imports Lightning; reached through
``shardpoint.integrations.lightning.ShardpointCheckpointIO``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
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

from . import _lightning_files as lf
from ._lightning_reader import install as install_reader
from ._state import PendingSaves, module_targets

__all__ = ["ShardpointCheckpointIO"]


class ShardpointCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that saves through shardpoint:
    ``Trainer(plugins=[ShardpointCheckpointIO()])``.

    Each checkpoint is one file at the path Lightning chooses (the single-file form,
    FORMAT.md §10), renamed into place when complete; an object-store URL (``s3://``...) is a
    checkpoint prefix written by the core, other fsspec URLs (``memory://``...) get the file's
    bytes through fsspec. Lightning's own ``.ckpt`` files still load (``torch.load`` with
    ``weights_only=True``), so a run resumes from them and saves shardpoint from then on.
    Constructing the plugin also lets Lightning's loader read shardpoint files
    (``LightningModule.load_from_checkpoint``, ``Fabric.load``; see ``_lightning_reader``).

    Args:
        blocking: ``False`` returns from ``save_checkpoint`` once the state is snapshotted
            (tensors copied into reused host buffers, in parallel); compression, write and
            commit run in the background, and ``load_checkpoint``/``remove_checkpoint`` of that
            path and ``teardown`` wait for them (re-raising a failed save's error). Saves to
            fsspec URLs are always blocking.
        compression, level, durable: as :func:`shardpoint.torch.save`.
        storage_options: credentials/endpoint of an object store (docs/OBJECT_STORE.md), or
            fsspec's options for other URLs; ``trainer.save_checkpoint(path,
            storage_options=...)`` overrides them for one save.

    Pickles (spawn strategies send it to their processes): in-flight saves stay with the
    process that started them. Also works wrapped in ``AsyncCheckpointIO(...)``.
    """

    def __init__(
        self,
        *,
        blocking: bool = True,
        compression: str | None = "zstd",
        level: int | None = None,
        durable: bool = True,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.blocking = blocking
        self.compression = compression
        self.level = level
        self.durable = durable
        self.storage_options = dict(storage_options) if storage_options is not None else None
        self._pending = PendingSaves()
        install_reader()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_pending"]  # a lock and this process's futures
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending = PendingSaves()
        install_reader()

    def _options(self, storage_options: Any) -> Mapping[str, Any] | None:
        if storage_options is None:
            return self.storage_options
        if not isinstance(storage_options, Mapping):
            raise TypeError(
                "ShardpointCheckpointIO: storage_options must be a mapping (an object store's "
                "credentials/endpoint, or fsspec's options), got "
                f"{type(storage_options).__name__}"
            )
        return storage_options

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Save Lightning's checkpoint dict as one file at ``path``."""
        key = os.fspath(path)
        self._pending.wait(key)  # two saves to one path commit in call order
        fut = lf.save(
            checkpoint,
            path,
            blocking=self.blocking,
            compression=self.compression,
            level=self.level,
            durable=self.durable,
            storage_options=self._options(storage_options),
        )
        if fut is not None:
            self._pending.add(key, fut)

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint dict at ``path``: a shardpoint checkpoint, or Lightning's own file
        read with ``torch.load(weights_only=True)`` whatever ``weights_only`` says (nothing a
        file could use to run code is unpickled). A missing path raises
        ``FileNotFoundError("Checkpoint file not found: ...")`` as Lightning words it."""
        self._pending.wait(os.fspath(path))
        module = self._restoring_module(sys._getframe(1))
        into = None
        if module is not None:
            targets = module_targets(module)
            into = {"state_dict": targets} if targets is not None else None
        return lf.load(path, map_location, into=into, storage_options=self.storage_options)

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
        """Delete the checkpoint at ``path`` (``ModelCheckpoint``'s ``save_top_k`` rotation)."""
        self._pending.wait(os.fspath(path))
        lf.remove(path, self.storage_options)

    def teardown(self) -> None:
        """Wait for every background save (Lightning calls this at the end of fit)."""
        self._pending.wait()

    def wait(self) -> None:
        """Block until every ``blocking=False`` save has committed (raises a failed one's error)."""
        self._pending.wait()
