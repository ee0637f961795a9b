"""Lightning checkpoints as shardpoint files: where one lives, how it is written and read.

Imports neither Lightning nor fsspec until a URL needs fsspec. The checkpoint Lightning names
``path`` is, by where ``path`` points:

* a local path (or ``file://``): one file at ``path``, the single-file form (FORMAT.md §10),
  written to a temp file and renamed over ``path``;
* an object-store URL (``s3://``, ``gs://``, ``az://`` and their aliases): checkpoint prefix
  ``path`` through the core's object-store support (``path.index`` + ``path.data-*``, committed
  by the index's conditional put, FORMAT.md §8.2): the single-file container is local only;
* any other URL fsspec knows (``memory://``, ``http(s)://``...): the single file's bytes,
  written and read through fsspec (an unknown protocol is a clear error, never a local
  directory named after the scheme).

Reading recognises a checkpoint by its content, never its name: our single file (its first
bytes), the directory form earlier versions wrote (``path/state.index``), and Lightning's own
``torch.save`` files, read with ``torch.load(weights_only=True)`` and nothing less safe.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from collections.abc import Mapping
from typing import IO, Any

from .. import storage as files
from ..errors import InvalidArgumentError, UnsupportedDTypeError
from ._state import WRITER_KEY, part_prefix

__all__ = ["NAME", "is_checkpoint", "load", "load_native", "not_found", "remove", "save", "where"]

NAME = "lightning"
#: the part holding the whole dict in the directory form of earlier versions (``path/state``)
PART = "state"
_MAGIC = b"SPSINGLE"  # FORMAT.md §10: the first bytes of a single-file checkpoint
_LOCAL, _STORE, _FSSPEC = "local", "store", "fsspec"


def _text(path: Any) -> str:
    p = os.fspath(path)
    if not isinstance(p, str):
        raise InvalidArgumentError(f"lightning: checkpoint path must be a str, got {p!r}")
    return p


def where(path: Any) -> str:
    """``"local"``, ``"store"`` (an object-store URL the core writes) or ``"fsspec"``."""
    p = _text(path)
    if "://" not in p or p.startswith("file://"):
        return _LOCAL
    if files.is_url(p) and not p.startswith("memory://"):
        return _STORE
    # memory:// is fsspec's in-memory file system here: the one Lightning's own code (its
    # ModelCheckpoint, "last" lookups) lists, not the core's object_store memory store
    return _FSSPEC


def _local(path: Any) -> str:
    p = _text(path)
    if p.startswith("file://"):
        from urllib.parse import unquote, urlparse

        p = unquote(urlparse(p).path)
    return p


def _fs(path: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs

        return url_to_fs(path, **dict(storage_options or {}))
    except (ImportError, ValueError) as e:
        raise InvalidArgumentError(
            f"lightning: cannot store a checkpoint at {path!r}: {e}. shardpoint writes local "
            "paths, object-store URLs (s3://, gs://, az://) and URLs of file systems fsspec "
            "knows (memory://...)"
        ) from e


def _dir_form(p: str) -> bool:
    """Whether local ``p`` is a checkpoint directory written by an earlier version, also one
    whose ``state.index`` is gone beside its data shards (``load`` names the missing index;
    Lightning's own loader said only "Is a directory")."""
    if not os.path.isdir(p):
        return False
    if files.exists(part_prefix(p, PART)):
        return True
    names = os.listdir(p)
    return f"{PART}.index" not in names and any(n.startswith(f"{PART}.data-") for n in names)


def _peek(f: IO[bytes]) -> bytes:
    start = f.tell()
    try:
        return f.read(len(_MAGIC))
    finally:
        f.seek(start)


def not_found(path: Any) -> FileNotFoundError:
    """Lightning's own wording (``TorchCheckpointIO.load_checkpoint``)."""
    return FileNotFoundError(f"Checkpoint file not found: {path}")


def is_checkpoint(path_or_file: Any, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``path_or_file`` holds a checkpoint shardpoint wrote (by content)."""
    if not isinstance(path_or_file, str | os.PathLike):
        seekable = getattr(path_or_file, "seekable", None)
        return bool(callable(seekable) and seekable() and _peek(path_or_file) == _MAGIC)
    kind = where(path_or_file)
    if kind == _LOCAL:
        p = _local(path_or_file)
        return files.is_single_file(p) or _dir_form(p)
    if kind == _STORE:
        try:
            return files.exists(_text(path_or_file), storage_options=storage_options)
        except Exception:  # no credentials, no network: not ours to answer; Lightning's is
            return False
    try:
        fs, p = _fs(_text(path_or_file), storage_options)
        with fs.open(p, "rb") as f:
            return bool(f.read(len(_MAGIC)) == _MAGIC)
    except Exception:  # missing, unreadable, an HTTP error...: not ours; Lightning's to answer
        return False


def save(
    checkpoint: Mapping[str, Any],
    path: Any,
    *,
    blocking: bool = True,
    compression: str | None = "zstd",
    level: int | None = None,
    durable: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """Write Lightning's checkpoint dict at ``path``; the save's future when it runs in the
    background (``blocking=False`` on a local path or an object store), else ``None``."""
    from .. import torch as sptorch

    kind = where(path)
    options: dict[str, Any] = {
        "compression": compression,
        "level": level,
        "metadata": {WRITER_KEY: NAME},
    }
    try:
        if kind == _FSSPEC:
            fs, p = _fs(_text(path), storage_options)
            parent = os.path.dirname(p)
            if parent:
                fs.makedirs(parent, exist_ok=True)
            with fs.open(p, "wb") as f:  # fsspec streams: written whole, as Lightning's own
                sptorch.save(checkpoint, f, **options)
            return None
        if kind == _STORE:
            return sptorch.save(
                checkpoint,
                _text(path),
                blocking=blocking,
                durable=durable,
                storage_options=storage_options,
                single_file=False,
                **options,
            )
        p = _local(path)
        os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
        if os.path.isdir(p) and not os.path.islink(p):
            return _replace_directory(checkpoint, p, durable=durable, **options)
        return sptorch.save(
            checkpoint, p, blocking=blocking, durable=durable, single_file=True, **options
        )
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(
            f"lightning checkpoint {os.fspath(path)!r}: {e}{_hparam_hint(str(e))}"
        ) from e


def _hparam_hint(message: str) -> str:
    """For a hyper-parameter with no declarative form (an ``nn.Module`` loss, a file-system
    object...), Lightning's own way out: keep it out of the saved hyper-parameters."""
    found = re.search(r"key '(?:datamodule_)?hyper_parameters/([^/']+)", message)
    if found is None:
        return ""
    return (
        f"; or leave it out of the saved hyper-parameters: "
        f"self.save_hyperparameters(ignore=[{found.group(1)!r}]) (Lightning recommends this "
        "for nn.Module arguments, whose weights the state_dict already holds)"
    )


def _replace_directory(checkpoint: Mapping[str, Any], p: str, **options: Any) -> None:
    """Save over a checkpoint directory of an earlier version: the new file is complete
    before the directory goes. Any other directory is refused (never deleted)."""
    from .. import torch as sptorch

    if not _dir_form(p):
        raise IsADirectoryError(f"lightning: cannot save a checkpoint at {p!r}: it is a directory")
    staged = p + ".shardpoint-new"
    sptorch.save(checkpoint, staged, single_file=True, **options)
    shutil.rmtree(p)
    os.replace(staged, p)


def load(
    path: Any,
    map_location: Any = None,
    *,
    into: Any = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint dict at ``path`` (a path, URL or binary file object), as ``torch.load``
    of a native ``.ckpt`` returns it. ``into``: live tensors nested as the checkpoint, filled
    in place (``shardpoint.torch.tensors._load``). Lightning's own files are read with
    ``torch.load(weights_only=True)``."""
    from ..torch.file_objects import stream_path
    from ..torch.tensors import _load

    def ours(p: str) -> dict[str, Any]:
        return dict(_load(p, map_location, None, True, False, storage_options, into=into))

    if not isinstance(path, str | os.PathLike):  # a file object
        if _peek(path) == _MAGIC:
            with stream_path(path) as p:
                return ours(p)
        return load_native(path, map_location, path)
    kind = where(path)
    if kind == _STORE and files.exists(_text(path), storage_options=storage_options):
        return ours(_text(path))
    if kind in (_STORE, _FSSPEC):
        # an object named exactly `path` on a store (Lightning's own file, written through
        # fsspec) is read through fsspec too, with fsspec's credentials (the environment)
        try:
            fs, p = _fs(_text(path), storage_options if kind == _FSSPEC else None)
        except InvalidArgumentError:
            if kind == _STORE:  # no fsspec file system for it: nothing else can be there
                raise not_found(path) from None
            raise
        if not fs.exists(p):
            raise not_found(path)
        with fs.open(p, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                f.seek(0)
                return load_native(f, map_location, path)
            f.seek(0)
            with stream_path(f) as local:
                return ours(local)
    p = _local(path)
    if files.is_single_file(p):
        return ours(p)
    if os.path.isdir(p):  # the directory form (a clear NotFoundError when its index is missing)
        from ._state import load_tree

        prefix = part_prefix(p, PART)
        return dict(load_tree(prefix, integration=NAME, device=map_location, into=into))
    if not os.path.exists(p):
        raise not_found(path)
    return load_native(p, map_location, path)


def load_native(f: Any, map_location: Any, name: Any) -> dict[str, Any]:
    """A checkpoint Lightning wrote itself (``torch.save``), read with
    ``torch.load(weights_only=True)``: nothing that restriction refuses is unpickled."""
    import torch

    try:
        out = torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise pickle.UnpicklingError(
            f"lightning: {name} is a checkpoint Lightning wrote itself (torch.save); shardpoint "
            "reads those with torch.load(weights_only=True) only, which refused it: "
            f"{str(e).splitlines()[0]}. If you trust the file, allow what it names with "
            "torch.serialization.add_safe_globals([...]) and load again (the next save "
            "writes shardpoint's format)"
        ) from e
    if not isinstance(out, dict):
        raise InvalidArgumentError(f"lightning: {name} holds a {type(out).__name__}, not a dict")
    return out


def remove(path: Any, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the checkpoint at ``path`` (absent is fine)."""
    kind = where(path)
    if kind == _STORE:
        if files.exists(_text(path), storage_options=storage_options):
            files.remove(_text(path), storage_options=storage_options)
        return
    if kind == _FSSPEC:
        fs, p = _fs(_text(path), storage_options)
        if fs.exists(p):
            fs.rm(p, recursive=True)
        return
    p = _local(path)
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)
