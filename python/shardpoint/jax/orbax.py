"""Orbax interop: a ``CheckpointHandler`` so ``orbax.checkpoint.CheckpointManager`` saves and
restores pytrees through shardpoint, synchronously or asynchronously.

>>> import orbax.checkpoint as ocp
>>> from shardpoint.jax import ShardpointSave, ShardpointRestore
>>> mngr = ocp.CheckpointManager("/ckpts")                                  # doctest: +SKIP
>>> mngr.save(step, args=ShardpointSave(state))                            # doctest: +SKIP
>>> state = mngr.restore(step, args=ShardpointRestore(abstract_state))     # doctest: +SKIP

The args classes are registered with the handler (``ocp.args.register_with_handler``), so the
manager picks the handler from them, alone or inside ``ocp.args.Composite``. In each item
directory the handler writes one shardpoint checkpoint, prefix ``<item dir>/checkpoint``.

Asynchronous saves (the manager's default): ``async_save`` copies every leaf this process
writes to host memory before it returns (the caller may then change or donate its arrays), and
the returned commit future writes and commits the checkpoint in the background. With several
processes each commits its partial index and ``finalize`` merges them on process 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import future as ocp_future

from .. import storage
from .checkpoint import META_KEY, restore, snapshot, write_snapshot

__all__ = ["ShardpointCheckpointHandler", "ShardpointSave", "ShardpointRestore", "PREFIX_NAME"]

#: The checkpoint prefix inside an item directory.
PREFIX_NAME = "checkpoint"


def _prefix(directory: Any) -> str:
    return str(directory / PREFIX_NAME)


class ShardpointCheckpointHandler(ocp.AsyncCheckpointHandler):
    """Saves a pytree as a shardpoint checkpoint (zstd-compressed, crc32c-checked by default)."""

    def __init__(self, *, compression: str | None = "zstd", level: int | None = None) -> None:
        self._compression = compression
        self._level = level

    def _write(self, directory: Any, spec: dict[str, Any], items: list[tuple[str, Any]]) -> None:
        import jax

        write_snapshot(
            _prefix(directory),
            spec,
            items,
            compression=self._compression,
            level=self._level,
            merge=jax.process_count() == 1,
        )

    async def async_save(
        self, directory: Any, args: ShardpointSave | None = None
    ) -> list[ocp_future.Future] | None:
        """Snapshot to host now; write and commit in the returned future."""
        if args is None:
            raise ValueError("pass args=ShardpointSave(tree)")
        spec, items = snapshot(args.item)

        async def commit() -> None:
            await asyncio.to_thread(self._write, directory, spec, items)

        return [ocp_future.CommitFutureAwaitingContractedSignals(commit(), name="shardpoint_save")]

    def save(self, directory: Any, args: ShardpointSave | None = None) -> None:
        """Save synchronously."""
        if args is None:
            raise ValueError("pass args=ShardpointSave(tree)")
        spec, items = snapshot(args.item)
        self._write(directory, spec, items)

    def finalize(self, directory: Any) -> None:
        """With several processes, merge their partial indexes (process 0, after all wrote)."""
        import jax

        if jax.process_count() > 1 and jax.process_index() == 0:
            storage.merge(_prefix(directory), jax.process_count())

    def restore(self, directory: Any, args: ShardpointRestore | None = None) -> Any:
        """Restore into ``args.item``'s structure, dtypes and shardings (or the saved
        structure as numpy arrays when there is no target)."""
        target = args.item if args is not None else None
        subtree = args.subtree if args is not None else None
        return restore(_prefix(directory), target, subtree=subtree)

    def metadata(self, directory: Any) -> Any:
        """The saved tree structure (key paths, shapes, dtypes) without reading any tensor."""
        with storage.open(_prefix(directory)) as r:
            stored = r.metadata.get(META_KEY)
        return stored.get("tree") if isinstance(stored, dict) else None

    def close(self) -> None:
        pass


def _register_type() -> None:
    """Put the handler in orbax's registry of handler types: ``CheckpointManager.restore(step)``
    without args finds an item's handler by the type string its step metadata records
    (``shardpoint.jax.orbax.ShardpointCheckpointHandler``). The registry is orbax-internal
    (its own handlers register there too); an orbax without it keeps needing args."""
    try:
        from orbax.checkpoint._src.handlers import handler_type_registry
    except ImportError:
        return
    handler_type_registry.register_handler_type(ShardpointCheckpointHandler)


_register_type()


@ocp.args.register_with_handler(ShardpointCheckpointHandler, for_save=True)
@dataclasses.dataclass
class ShardpointSave(ocp.args.CheckpointArgs):
    """Save args: ``item`` is the pytree."""

    item: Any


@ocp.args.register_with_handler(ShardpointCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class ShardpointRestore(ocp.args.CheckpointArgs):
    """Restore args: ``item`` is the optional target tree (arrays or ``jax.ShapeDtypeStruct``
    with shardings); ``subtree`` restores only the subtree at that key path."""

    item: Any = None
    subtree: str | None = None
