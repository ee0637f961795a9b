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

A damaged checkpoint of ours is refused by the fronts, before DCP's load starts: DCP runs the
reader inside its collective steps and raises every error there as its ``CheckpointException``
(a ``BaseException``: ``except Exception`` misses it) whose message is a traceback, where
shardpoint's error is one line further down. So the reader is opened here (the index read and
every shard's size checked: what its ``read_metadata`` would do first, on every rank, so no
extra work), and ``P.index`` gone while ``P.data-*`` remain (DCP said "No such file:
'P/.metadata'") raises shardpoint's ``NotFoundError`` naming the index; a shard cut short or
gone raises the reader's error naming that shard. Each is raised as shardpoint's class and
DCP's ``CheckpointException`` at once (``shardpoint.torch.dcp_errors``: a caller catching
either, or ``Exception``, catches it), with shardpoint's one-line message. Every rank raises
it alike, before any collective, so none waits on another. ``storage_reader=shardpoint.torch.StorageReader(P)``
given to ``dcp.load`` is opened here too.
"""

from __future__ import annotations

import os
import sys

from . import _MARK, INDEX_MAGIC, _starts_with, dress, local_path, refuse_missing_index

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


#: the part a ``StorageWriter`` given a directory writes in it (``dcp_paths.DIRECTORY_CHECKPOINT``)
_PARTS = ("checkpoint",)


def _reader(path: Any) -> Any:
    from shardpoint.torch.dcp import StorageReader

    return StorageReader(path)


def _as_dcp(err: BaseException) -> BaseException:
    """shardpoint's error ``err`` as DCP's too (``shardpoint.torch.dcp_errors``: callers that
    catch DCP's ``CheckpointException`` still catch it); any other error as it is."""
    ours = sys.modules.get("shardpoint.errors")
    if ours is None or not isinstance(err, ours.CheckpointError):
        return err
    from shardpoint.torch.dcp_errors import as_dcp_error

    return as_dcp_error(err).with_traceback(err.__traceback__)


def _as_dcp_on_error(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, shardpoint's errors raised as DCP's too (:func:`_as_dcp`)."""
    try:
        return call(*args)
    except Exception as err:
        raise _as_dcp(err) from None


def _opened(reader: Any) -> Any:
    """``reader`` with its checkpoint opened now, outside DCP's collective steps (see the
    module docstring); DCP's ``read_metadata`` then reuses what it opened."""
    _as_dcp_on_error(reader._open)
    return reader


def _refuse_lost_index(path: Any, who: str) -> None:
    """``refuse_missing_index`` for DCP's part name, its error DCP's too."""
    _as_dcp_on_error(refuse_missing_index, path, who, _PARTS)


def _ours(storage: Any) -> bool:
    """Whether ``storage`` is shardpoint's DCP reader (its module is imported if it is)."""
    dcp = sys.modules.get("shardpoint.torch.dcp")
    return dcp is not None and isinstance(storage, dcp.StorageReader)


def _setup_front(original: Callable[..., Any], enabled: Callable[[], bool]) -> Callable[..., Any]:
    def _storage_setup(storage: Any, checkpoint_id: Any, reader: bool = False) -> Any:
        if not reader or not enabled():
            return original(storage, checkpoint_id, reader)
        if storage:
            got = original(storage, checkpoint_id, reader)
            return _opened(got) if _ours(got) else got
        if not is_dcp_checkpoint(checkpoint_id):
            _refuse_lost_index(checkpoint_id, "dcp.load")
            return original(storage, checkpoint_id, reader)
        got = _reader(checkpoint_id)
        got.reset(checkpoint_id)
        return _opened(got)

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
        if cls is owner and enabled():
            if is_dcp_checkpoint(path):
                # not an instance of cls: Python does not run FileSystemReader.__init__ on it
                return _opened(_reader(path))
            _refuse_lost_index(path, "FileSystemReader")
        if original is object.__new__:
            return original(cls)
        return original(cls, *args, **kwargs)

    setattr(__new__, _MARK, original)
    setattr(owner, "__new__", __new__)  # noqa: B010  # a staticmethod slot set on the class
