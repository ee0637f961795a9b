"""``torch.distributed.checkpoint`` reading a checkpoint shardpoint's DCP ``StorageWriter``
wrote, without naming shardpoint's reader, in any process where shardpoint is installed.

A user saved with ``dcp.save(sd, storage_writer=shardpoint.torch.StorageWriter(P))``; the next
script loads the way DCP's tutorials do — ``dcp.load(sd, checkpoint_id=P)``,
``dcp.load(sd, storage_reader=FileSystemReader(P))``, or converts with
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(P, "model.pt")`` — and DCP said
"No such file or directory: 'P/.metadata'", never "shardpoint". Two fronts, installed once the
DCP modules have run (standard library only until a path turns out to be ours):

- ``_storage_setup`` (how DCP picks a reader for a bare ``checkpoint_id``): our checkpoint
  gets ``shardpoint.torch.StorageReader``;
- ``FileSystemReader(path)``: for our checkpoint the constructor returns a
  ``shardpoint.torch.StorageReader`` instead (a DCP ``StorageReader`` too, with every option at
  its default: crc32c checked, nothing unpickled beyond ``weights_only``).

"Ours": a local path ``P`` whose ``P.index`` is shardpoint's, or a directory without DCP's
``.metadata`` holding a shardpoint index. Everything else — DCP's own directories first — is
DCP's, unchanged. ``SHARDPOINT_TORCH_LOAD=0`` leaves both fronts out (DCP's own error).
"""

from __future__ import annotations

import os
import sys

from . import _MARK, INDEX_MAGIC, _starts_with, dress, local_path

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["is_dcp_checkpoint", "patch_filesystem", "patch_storage_utils"]


def is_dcp_checkpoint(path: Any) -> bool:
    """Whether ``path`` names a checkpoint of ours that DCP's own readers cannot read. Never
    raises."""
    try:
        p = local_path(path)
        if p is None:
            return False
        p = p.rstrip("/") or p
        if os.path.isdir(p):
            if os.path.exists(os.path.join(p, ".metadata")):
                return False  # DCP's own directory
            return any(
                n.endswith(".index") and _starts_with(os.path.join(p, n), INDEX_MAGIC)
                for n in os.listdir(p)
            )
        return _starts_with(p + ".index", INDEX_MAGIC)
    except (OSError, ValueError, TypeError):
        return False


def _reader(path: Any) -> Any:
    from shardpoint.torch.dcp import StorageReader

    return StorageReader(path)


def _setup_front(original: Callable[..., Any], enabled: Callable[[], bool]) -> Callable[..., Any]:
    def _storage_setup(storage: Any, checkpoint_id: Any, reader: bool = False) -> Any:
        if storage or not reader or not enabled() or not is_dcp_checkpoint(checkpoint_id):
            return original(storage, checkpoint_id, reader)
        got = _reader(checkpoint_id)
        got.reset(checkpoint_id)
        return got

    dress(_storage_setup, original)
    return _storage_setup


def patch_storage_utils(module: ModuleType, enabled: Callable[[], bool]) -> None:
    """Front ``_storage_setup``, also where DCP's loader and saver imported it by name."""
    current = getattr(module, "_storage_setup", None)
    if current is None or hasattr(current, _MARK):
        return
    front = _setup_front(current, enabled)
    for name in ("state_dict_loader", "state_dict_saver"):
        mod = sys.modules.get("torch.distributed.checkpoint." + name)
        if mod is not None and getattr(mod, "_storage_setup", None) is current:
            mod._storage_setup = front  # type: ignore[attr-defined]
    module._storage_setup = front  # type: ignore[attr-defined]


def patch_filesystem(module: ModuleType, enabled: Callable[[], bool]) -> None:
    """``FileSystemReader(path)`` of one of our checkpoints returns shardpoint's reader."""
    owner = getattr(module, "FileSystemReader", None)
    if not isinstance(owner, type) or hasattr(owner.__dict__.get("__new__"), _MARK):
        return
    original: Any = owner.__new__

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        path = args[0] if args else kwargs.get("path")
        if cls is owner and enabled() and is_dcp_checkpoint(path):
            # not an instance of cls: Python does not run FileSystemReader.__init__ on it
            return _reader(path)
        if original is object.__new__:
            return original(cls)
        return original(cls, *args, **kwargs)

    setattr(__new__, _MARK, original)
    setattr(owner, "__new__", __new__)  # noqa: B010  # a staticmethod slot set on the class
