"""Checkpoint paths and object-store URLs: what a prefix names (a local prefix, a ``file://``
URL, an ``s3://``/``gs://``/``az://``/``memory://`` URL, a single file), whether a checkpoint
exists there, removing one, and the small-object helpers of object stores (the object graph's
state object, the CLI's listings)."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping
from typing import Any

from .. import _core
from ..errors import (
    CheckpointError,
    CorruptCheckpointError,
    InvalidArgumentError,
    NotFoundError,
)

__all__ = [
    "PathLike",
    "StorageOptions",
    "SINGLE_FILE_SUFFIXES",
    "wants_single_file",
    "is_single_file",
    "is_url",
    "SERVING_WHOLE",
    "checkpoints_in",
    "directory_prefix",
    "index_missing",
    "lost_index",
    "remote_lost_index",
    "exists",
    "remove",
    "read_object",
    "write_object",
    "delete_object",
    "list_url",
    "gc",
]

PathLike = str | os.PathLike[str]
#: Credentials, endpoint and knobs of an object store (``s3://``, ``gs://``, ``az://``,
#: ``memory://``), as obstore/fsspec take them; ``None`` = the environment only. See
#: docs/OBJECT_STORE.md.
StorageOptions = Mapping[str, Any] | None

#: File name suffixes that make a save write the single-file form (FORMAT.md §10) when
#: ``single_file`` is not given: the names torch users give ``torch.save`` files.
SINGLE_FILE_SUFFIXES = (".pt", ".pth", ".bin", ".sp")


def _prefix(prefix: PathLike) -> str:
    p = os.fspath(prefix)
    if not isinstance(p, str):
        raise InvalidArgumentError(f"prefix must be a str path, got {type(p).__name__}")
    if not p or p.endswith(os.sep) or p.endswith("/"):
        raise InvalidArgumentError(f"prefix {p!r} must name a file prefix, not a directory")
    if p.startswith("file://"):
        # file:// is a local path: the mmap fast path, local commit protocol.
        from urllib.parse import unquote, urlparse

        u = urlparse(p)
        if u.netloc not in ("", "localhost"):
            raise InvalidArgumentError(f"{p!r}: file:// URLs must name a local path")
        p = unquote(u.path)
    return p


def wants_single_file(path: str, single_file: bool | None) -> bool:
    """Whether a save at ``path`` writes the single-file form: ``single_file`` when given,
    else whether the name ends with one of :data:`SINGLE_FILE_SUFFIXES`."""
    if single_file is not None:
        return bool(single_file)
    return path.lower().endswith(SINGLE_FILE_SUFFIXES)


def is_single_file(path: PathLike) -> bool:
    """Whether ``path`` is a single-file checkpoint (recognised by its first bytes, never by
    its name)."""
    p = os.fspath(path)
    return isinstance(p, str) and not _core.is_remote(p) and _core.is_single_file(p)


def is_url(prefix: PathLike) -> bool:
    """Whether ``prefix`` names an object-store URL (``s3://``, ``gs://``, ``az://``,
    ``memory://``); local paths and ``file://`` URLs are not."""
    p = os.fspath(prefix)
    return isinstance(p, str) and _core.is_remote(p)


#: The whole model's checkpoint prefix in a serving directory (``shardpoint export`` writes
#: ``DIR/model.index``; tensor-parallel pieces are ``DIR/model-rank-R-of-N``).
SERVING_WHOLE = "model"
_INDEX_MAGIC = b"SPINDEX\0"  # FORMAT.md §3: TensorFlow's ``*.ckpt.index`` is not ours


def _is_index(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_INDEX_MAGIC)) == _INDEX_MAGIC
    except OSError:
        return False


def checkpoints_in(directory: str) -> list[str]:
    """The checkpoint prefixes a local directory stands for, as the serving loaders read it:
    ``[DIR/model]`` when ``DIR/model.index`` is one of ours; none when ``DIR`` holds
    ``*.safetensors`` weights (a Hugging Face directory, read in place); else every
    ``DIR/*.index`` prefix whose index is ours but tensor-parallel pieces (``*-rank-R-of-N``),
    sorted. Empty when ``directory`` is not a
    directory, or is the hashed directory ``P/`` beside a prefix's ``P.index`` (FORMAT.md
    §3.1.1)."""
    d = directory.rstrip("/") or directory
    if not os.path.isdir(d) or os.path.isfile(d + ".index"):
        return []
    if _is_index(os.path.join(d, SERVING_WHOLE + ".index")):
        return [os.path.join(d, SERVING_WHOLE)]
    if glob.glob(os.path.join(glob.escape(d), "*.safetensors")):
        # a Hugging Face directory: its weights are the model, not a checkpoint beside them
        # (a Trainer's checkpoint-N keeps its optimizer state in `shardpoint.index`)
        return []
    return [
        x[: -len(".index")]
        for x in sorted(glob.glob(os.path.join(glob.escape(d), "*.index")))
        if "-rank-" not in os.path.basename(x) and _is_index(x)
    ]


def directory_prefix(path: str) -> str:
    """``path``, or the one checkpoint prefix of the local directory ``path`` names
    (:func:`checkpoints_in`): ``sp.open(DIR)`` of a directory ``shardpoint export`` wrote, or
    of one holding a single checkpoint, opens that checkpoint (a ``file://`` URL too)."""
    if not isinstance(path, str) or not path or is_url(path):
        return path
    local = _prefix(path.rstrip("/") or path) if path.startswith("file://") else path
    found = checkpoints_in(local)
    return found[0] if len(found) == 1 else path


#: the parts a checkpoint directory of ours holds: the trainer integrations' ``state``, a serving
#: directory's ``model``, a Hugging Face / accelerate checkpoint's ``shardpoint``, and the
#: ``checkpoint`` a DCP ``StorageWriter`` given a directory (or orbax's handler) writes there
_LOST_PARTS = ("state", "model", "shardpoint", "checkpoint")


def _lost_index_message(prefix: str, where: str, who: str, shards: list[str] | None = None) -> str:
    """What :func:`index_missing` says: the lost index, and the data shards that are there
    (``shards``: their names, listed by the caller; else from ``prefix``'s directory)."""
    if shards is None:
        directory, base = os.path.split(prefix)
        try:
            shards = sorted(
                n for n in os.listdir(directory or ".") if n.startswith(base + ".data-")
            )
        except OSError:
            shards = []
    listed = ", ".join(shards[:3]) + (f" and {len(shards) - 3} more" if len(shards) > 3 else "")
    return (
        f"{who + ': ' if who else ''}{where!r} is a shardpoint checkpoint whose index "
        f"{prefix + '.index'!r} is missing: its data shards ({listed}) are there, but nothing "
        "in them can be read without the index. A save killed before its commit, or a copy or "
        "upload that left the .index file out, leaves this: copy the index over again, or "
        "load an earlier checkpoint."
    )


def index_missing(
    prefix: str, where: str, who: str = "", *, corrupt: bool = False
) -> NotFoundError | CorruptCheckpointError:
    """The error for a checkpoint ``where`` whose part ``prefix`` lost its index while its data
    shards are still there (:func:`lost_index`), raised by the reader and by the next script's
    fronts (``who``: the call, named first when given) instead of "no checkpoint" or the
    framework's own "no file named ...", which never say that the data is there and only its
    index is not. ``NotFoundError`` (a ``FileNotFoundError``), or with ``corrupt``
    ``CorruptCheckpointError`` (a ``ValueError``) where the framework's own error is one."""
    cls = CorruptCheckpointError if corrupt else NotFoundError
    return cls(_lost_index_message(prefix, where, who))


def lost_index(path: str, who: str = "") -> NotFoundError | None:
    """:func:`index_missing`'s ``NotFoundError`` for ``path`` (a prefix, or a directory holding
    one of ``_LOST_PARTS``) when its index is gone and data shards ``P.data-NNNNN-of-MMMMM``
    remain, else ``None``. The test is the startup file's
    (``_shardpoint_loaders.missing_index``), so the reader and the fronts agree on what a lost
    index is; a copy of the package without that sibling folder keeps the plain "not found"."""
    try:
        from _shardpoint_loaders import missing_index
    except ImportError:
        return None
    prefix = missing_index(path, _LOST_PARTS)
    return None if prefix is None else NotFoundError(_lost_index_message(prefix, path, who))


def remote_lost_index(url: str, storage_options: StorageOptions = None) -> NotFoundError | None:
    """:func:`lost_index` for an object-store prefix whose index object is not there: one
    listing of its "directory" (only after the open failed), and the lost-index error if data
    shards of that prefix (``P.data-NNNNN-of-MMMMM.<token>``) are there; ``None`` when none
    are, or the listing itself fails (the open's own "not found" stands then)."""
    parent, _, base = url.rstrip("/").rpartition("/")
    if not base or "://" not in parent + "/":
        return None
    try:
        names = _core.list_dir(parent + "/", storage_options=_storage(storage_options))
    except (CheckpointError, OSError):
        return None
    shards = sorted(n for n in names if n.startswith(base + ".data-"))
    if not shards:
        return None
    return NotFoundError(_lost_index_message(url, url, "", shards))


def not_found_error(path: str, err: NotFoundError) -> NotFoundError:
    """The error for a checkpoint that is not there, naming what the user typed and both
    forms looked for (a single file at ``path``, the prefix form's ``path.index``); the core
    names only the last one tried, a name the user never typed. A directory says which
    checkpoints it holds. Data shards without their index say that the index is what is
    missing (:func:`lost_index`). A missing shard of an index that exists keeps the core's
    error, which names that shard."""
    lost = lost_index(path)
    if lost is not None:
        return lost
    if os.path.isdir(path) and not os.path.exists(path + ".index"):
        pattern = os.path.join(glob.escape(path), "*.index")
        found = sorted(
            os.path.basename(p)[: -len(".index")] for p in glob.glob(pattern) if _is_index(p)
        )
        held = (
            f"it holds {len(found)} checkpoint{'s' * (len(found) != 1)} ({', '.join(found[:8])}"
            f"{', ...' if len(found) > 8 else ''}): open one by its prefix, e.g. "
            f"{os.path.join(path, found[0])!r}"
            if found
            else "it holds no shardpoint checkpoint (no *.index file of ours) and no "
            "safetensors weights"
        )
        return NotFoundError(f"no checkpoint at {path!r}: it is a directory, and {held}")
    if os.path.exists(path) or os.path.exists(path + ".index"):
        return err
    parent = os.path.dirname(os.path.abspath(path))
    where = "" if os.path.isdir(parent) else f"; the directory {parent!r} does not exist"
    return NotFoundError(
        f"no checkpoint at {path!r}: looked for the single file {path!r} and for the index "
        f"of a prefix checkpoint, {path + '.index'!r}; neither exists{where}"
    )


def _storage(options: StorageOptions) -> dict[str, str] | None:
    """``storage_options`` as the core takes them: str keys and values."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise InvalidArgumentError("storage_options must be a mapping of str to str")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in options.items()}


def exists(prefix: PathLike, *, storage_options: StorageOptions = None) -> bool:
    """Whether a committed checkpoint exists at ``prefix`` (a prefix or a single file)."""
    p = _prefix(prefix)
    if not is_url(p):
        return os.path.exists(p + ".index") or _core.is_single_file(p)
    return _core.exists(p, storage_options=_storage(storage_options))


def remove(prefix: PathLike, *, storage_options: StorageOptions = None) -> None:
    """Delete checkpoint ``prefix``: its index first (atomic disappearance), then its shards.
    A single-file checkpoint is one unlink."""
    p = _prefix(prefix)
    if not is_url(p) and _core.is_single_file(p):
        os.remove(p)
        return
    _core.remove(_prefix(prefix), storage_options=_storage(storage_options))


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """crc32c (Castagnoli, the checksum of FORMAT.md) of a bytes-like, continuing ``crc``;
    computed in the core with the GIL released. For callers that check whole files, such as
    the tiers' part copies."""
    return int(_core.crc32c(data, crc))


# --- small objects and listings of object stores (the object graph's state object, the CLI) ---
def read_object(url: str, *, storage_options: StorageOptions = None) -> tuple[bytes, str | None]:
    """A whole (small) object and its etag; ``NotFoundError`` when absent."""
    return _core.object_get(url, storage_options=_storage(storage_options))


def write_object(
    url: str,
    data: bytes,
    *,
    mode: str = "overwrite",
    etag: str | None = None,
    storage_options: StorageOptions = None,
) -> str | None:
    """Put a small object; returns its new etag. ``mode="create"`` fails if it exists,
    ``mode="update"`` fails unless its etag is still ``etag`` (``CheckpointIOError`` saying
    another writer changed it first)."""
    return _core.object_put(url, data, mode, etag, storage_options=_storage(storage_options))


def delete_object(url: str, *, storage_options: StorageOptions = None) -> None:
    """Delete an object (absent is fine)."""
    _core.object_delete(url, storage_options=_storage(storage_options))


def list_url(url: str, *, storage_options: StorageOptions = None) -> list[str]:
    """Names directly under the "directory" ``url`` (sub-directories end with ``/``)."""
    return _core.list_dir(url, storage_options=_storage(storage_options))


def gc(url: str, *, older_than: float = 3600.0, storage_options: StorageOptions = None) -> int:
    """Remove what saves that never committed left under ``url``, when at least
    ``older_than`` seconds old; returns how many objects (or files) and uploads.

    On an object store: the multipart uploads of writers killed mid-save (on S3 found with
    ListMultipartUploads; an upload whose newest part is younger than ``older_than`` is
    spared; docs/OBJECT_STORE.md), shards no index references, and partial indexes, aged
    on the store's clock (FORMAT.md §8.2). In a local directory: partial indexes, shards no
    index references and temp files no live writer holds, then hashed directories ``P/HH/``
    and ``P/`` left empty (:mod:`.local_gc`; docs/SCALE.md "A rank that dies mid-save")."""
    if not is_url(url):
        from .local_gc import gc_directory

        path = _prefix(url.rstrip("/")) if url.startswith("file://") else os.fspath(url)
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"{url}: gc takes a directory or an object-store URL")
        return gc_directory(path, float(older_than))
    return _core.gc(url, float(older_than), storage_options=_storage(storage_options))
