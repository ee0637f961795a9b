"""The DeepSpeed ``CheckpointEngine`` subclass (imports DeepSpeed; reached through
``shardpoint.integrations.deepspeed``)."""

from __future__ import annotations

import os
from typing import Any

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from ._state import PendingSaves, load_tree, part_prefix, save_tree
from .deepspeed import decode_objects, encode_objects

__all__ = ["ShardpointCheckpointEngine"]

_PART = "state"
_NAME = "deepspeed"


class ShardpointCheckpointEngine(CheckpointEngine):
    """A DeepSpeed ``CheckpointEngine`` writing each file DeepSpeed names as a directory holding
    one shardpoint checkpoint (``state.index`` + ``state.data-*``).

    Args:
        config_params: DeepSpeed's config (unused; DeepSpeed's engines take it).
        blocking: ``False`` returns from ``save`` once the state is snapshotted; ``commit``
            (which DeepSpeed calls before it writes the ``latest`` file) waits for every
            write, so ``latest`` never names a checkpoint that is not complete.
        compression, level: as :func:`shardpoint.torch.save`.
    """

    def __init__(
        self,
        config_params: Any = None,
        *,
        blocking: bool = True,
        compression: str | None = "zstd",
        level: int | None = None,
    ) -> None:
        super().__init__(config_params)
        self.name = "ShardpointCheckpointEngine"
        self.blocking = blocking
        self.compression = compression
        self.level = level
        self._pending = PendingSaves()

    def create(self, info: Any) -> None:
        """Start of a checkpoint (DeepSpeed's ``CheckpointCommitInfo``): nothing to prepare."""

    def save(self, state_dict: Any, path: str) -> None:
        """Write ``state_dict`` as directory ``path``."""
        directory = os.fspath(path)
        self._pending.wait(directory)
        fut = save_tree(
            encode_objects(state_dict),
            part_prefix(directory, _PART),
            integration=_NAME,
            blocking=self.blocking,
            compression=self.compression,
            level=self.level,
        )
        if fut is not None:
            self._pending.add(directory, fut)

    def load(self, path: str, map_location: Any = None) -> Any:
        """The state saved as ``path`` (tensors on the CPU, where DeepSpeed maps them too)."""
        directory = os.fspath(path)
        self._pending.wait(directory)
        return decode_objects(load_tree(part_prefix(directory, _PART), integration=_NAME))

    def commit(self, info: Any) -> bool:
        """Wait until every file of the checkpoint is committed (re-raises a failed write)."""
        self._pending.wait()
        return True

    def wait(self) -> None:
        """Block until every background write has committed."""
        self._pending.wait()

    def cleanup(self) -> None:
        self._pending.wait()

    def preserves_storage_sharing(self) -> bool:
        # tensors that share storage are stored once and come back sharing it
        return True
