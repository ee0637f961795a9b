"""PyTorch's own ``torch.distributed.checkpoint`` test files, run with shardpoint's one line
switched on (see ``conftest.py`` beside this file for the files, the commit and the counts).

The switch lives here, not only in the conftest: upstream's multi-rank tests
(``MultiProcessTestCase``) spawn each rank as a fresh interpreter that imports the test module
by name, so this package's ``__init__`` is the one piece of ours every rank runs before the
module binds ``FileSystemWriter`` / ``FileSystemReader``. While the switch is on in the pytest
process (around each test of this folder, from the conftest) it sets ``_RANKS_ENV`` in the
environment the ranks inherit; a process that imports this package with it set is such a rank,
lives for that one test, and gets the switch for its whole life. (``multiprocessing.
parent_process()`` cannot tell: a spawned child learns its parent only after it has unpickled
its target, which is when it imports this package.)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

NATIVE = os.environ.get("SHARDPOINT_UPSTREAM_NATIVE") == "1"
#: set while the switch is on in the pytest process: what the ranks it spawns inherit
_RANKS_ENV = "SHARDPOINT_UPSTREAM_DCP_RANK_SWITCH"


def _classes() -> tuple[type, type]:
    """The two stand-ins, built on first use (importing torch.distributed.checkpoint is slow).

    ``FileSystemWriter(path, ...)`` -> ``shardpoint.torch.StorageWriter(path, threads=
    thread_count, durable=sync_files)``: the user's one line, with the knobs we have under
    our names. Accepted and ignored, as we have no such knob: ``single_file_per_rank`` (each
    rank writes ``threads`` shard files of its own), ``per_thread_copy_ahead`` (no staging
    copy), ``cache_staged_state_dict`` (``dcp.async_save`` stages for us), ``overwrite`` (a
    save always replaces the checkpoint at ``path``, atomically), ``_extensions`` (DCP's
    per-file stream transforms: shardpoint compresses and checksums every value itself, zstd by
    default) and ``serialization_format`` (one format: shardpoint's).

    ``FileSystemReader(path, _extension_registry=None)`` -> ``shardpoint.torch.StorageReader
    (path)`` with its defaults (crc32c checked; non-tensor items unpickled only as far as
    ``torch.load(weights_only=True)`` accepts them).

    ``validate_checkpoint_id`` is ``FileSystemWriter``'s / ``FileSystemReader``'s (a local
    path): where DCP picks a storage for a bare ``checkpoint_id``, ours is picked wherever
    ``FileSystemWriter`` would have been, as if the user had added ``storage_writer=``.
    """
    global _CACHED
    if _CACHED is not None:
        return _CACHED
    from torch.distributed.checkpoint import filesystem

    from shardpoint.torch import StorageReader, StorageWriter

    class ShardpointFileSystemWriter(StorageWriter):  # type: ignore[misc]
        def __init__(
            self,
            path: str | os.PathLike[str],
            single_file_per_rank: bool = True,
            sync_files: bool = True,
            thread_count: int = 1,
            per_thread_copy_ahead: int = 10_000_000,
            cache_staged_state_dict: bool = False,
            overwrite: bool = True,
            _extensions: Sequence[Any] | None = None,
            serialization_format: Any = None,
        ) -> None:
            super().__init__(path, threads=thread_count, durable=sync_files)

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
            return bool(filesystem.FileSystemWriter.validate_checkpoint_id(checkpoint_id))

    class ShardpointFileSystemReader(StorageReader):  # type: ignore[misc]
        def __init__(self, path: str | os.PathLike[str], _extension_registry: Any = None) -> None:
            super().__init__(path)

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
            return bool(filesystem.FileSystemReader.validate_checkpoint_id(checkpoint_id))

    _CACHED = (ShardpointFileSystemWriter, ShardpointFileSystemReader)
    return _CACHED


_CACHED: tuple[type, type] | None = None


def _targets() -> list[tuple[Any, str, Any]]:
    """``(module, name, replacement)`` for every binding the switch replaces: the names
    ``torch.distributed.checkpoint`` exports (``from torch.distributed.checkpoint import
    FileSystemWriter`` in a test module, ``dcp.FileSystemWriter(...)`` in a test) and the
    writer DCP picks for a bare ``checkpoint_id`` (``_storage_utils``). Not replaced: the
    reader DCP picks for a bare ``checkpoint_id`` (a user passes no reader there: shardpoint's
    startup front hands DCP our reader for our checkpoints, DCP's own for DCP's; that is what
    those loads exercise) and DCP's own tools (``format_utils``: ``dcp_to_torch_save`` reads
    through ``FileSystemReader`` and that same front, ``torch_save_to_dcp`` writes DCP's
    format)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import _storage_utils

    # DCP's own modules that bind the names at import: imported before the switch so they
    # keep DCP's classes (a test module importing one of them for the first time while the
    # switch is on would otherwise hand it ours)
    for name in ("format_utils", "hf_storage", "fsspec_filesystem"):
        importlib.import_module(f"torch.distributed.checkpoint.{name}")

    writer, reader = _classes()
    return [
        (dcp, "FileSystemWriter", writer),
        (dcp, "FileSystemReader", reader),
        (_storage_utils, "FileSystemWriter", writer),
    ]


@contextmanager
def switched() -> Iterator[None]:
    """The switch on while the block runs (nothing when ``SHARDPOINT_UPSTREAM_NATIVE=1``)."""
    if NATIVE:
        yield
        return
    targets = _targets()
    saved = [(module, name, getattr(module, name)) for module, name, _ in targets]
    env = os.environ.get(_RANKS_ENV)
    for module, name, new in targets:
        setattr(module, name, new)
    os.environ[_RANKS_ENV] = "1"
    try:
        yield
    finally:
        for module, name, old in saved:
            setattr(module, name, old)
        if env is None:
            os.environ.pop(_RANKS_ENV, None)
        else:
            os.environ[_RANKS_ENV] = env


if not NATIVE and os.environ.get(_RANKS_ENV) == "1":
    # a rank process of one test: on for its whole life (it imports the test module next)
    for _module, _name, _new in _targets():
        setattr(_module, _name, _new)
