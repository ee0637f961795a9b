"""The one place where the object-graph layer touches storage.

Everything above this module speaks numpy values and key strings; everything below is the
storage facade (``shardpoint.storage``: ``save_file``, ``open``, ``exists``, ``remove``). Keeping
the boundary this small lets the object graph be tested against any storage with that API.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from .. import storage
from ..errors import CheckpointError
from ..storage.async_save import StagingBuffers
from .naming import OBJECT_GRAPH_KEY

__all__ = [
    "write_checkpoint",
    "stage_checkpoint",
    "open_reader",
    "checkpoint_exists",
    "remove_checkpoint",
    "is_url",
    "dirname",
    "list_names",
    "list_files_and_dirs",
    "remove_hashed_orphans",
    "read_small",
    "write_small",
    "delete_name",
]


def is_url(path: str) -> bool:
    """Whether ``path`` names an object-store URL (``s3://``, ``gs://``, ``az://``, ...)."""
    return bool(storage.is_url(path))


def dirname(path: str) -> str:
    """The directory part of a path or URL prefix."""
    if is_url(path):
        return path.rsplit("/", 1)[0]
    return os.path.dirname(path)


def write_checkpoint(
    prefix: str,
    values: dict[str, Any],
    graph_json: bytes,
    *,
    incremental: bool = False,
    base: str | None = None,
    digest: str | None = None,
    delta: int | None = None,
    compression: str | None = "zstd",
    hashed_prefixes: bool = False,
) -> None:
    """Write ``values`` plus the object graph atomically at ``prefix`` (parents created).
    ``delta``: a delta checkpoint against ``base`` with chains of at most that many links
    (FORMAT.md §11; a full save when there is no base or the chain is that long).
    ``incremental``: shard layout for incremental saves, re-using unchanged shards of ``base``
    (FORMAT.md §8.1). ``digest``: record strong digests of the files (FORMAT.md §7.1).
    ``compression``, ``hashed_prefixes``: ``sp.save_file``'s."""
    parent = os.path.dirname(prefix)
    if parent and not is_url(prefix):
        os.makedirs(parent, exist_ok=True)
    payload = dict(values)
    payload[OBJECT_GRAPH_KEY] = graph_json
    if delta is not None:
        if base is not None and storage.exists(base):
            storage.save_file(
                payload, prefix, base=base, delta=True, max_chain=delta, compression=compression
            )
        else:
            storage.save_file(payload, prefix, compression=compression)
        return
    if not incremental:
        storage.save_file(
            payload, prefix, digest=digest, compression=compression,
            hashed_prefixes=hashed_prefixes,
        )  # fmt: skip
        return
    if base is not None and not storage.exists(base):
        base = None
    storage.save_file(
        payload, prefix, incremental=True, base=base, digest=digest, compression=compression,
        hashed_prefixes=hashed_prefixes,
    )  # fmt: skip


def stage_checkpoint(
    prefix: str,
    values: dict[str, Any],
    graph_json: bytes,
    *,
    incremental: bool = False,
    base: Callable[[], str | None] | None = None,
    then: Callable[[], None] | None = None,
    digest: str | None = None,
    compression: str | None = "zstd",
    hashed_prefixes: bool = False,
) -> Callable[[StagingBuffers], Callable[[], None]]:
    """The ``stage`` step of an asynchronous :func:`write_checkpoint` for ``AsyncSaver.submit``:
    validates and encodes now, copies into the staging buffers when called, and returns the
    background writer. ``base()`` is asked in the background, just before writing (the
    previous save has committed by then); ``then()`` runs after the commit."""
    plan, items = _plan(
        prefix, values, graph_json, incremental, None, digest, compression, hashed_prefixes
    )

    def stage(bufs: StagingBuffers) -> Callable[[], None]:
        copy, crcs = bufs.stage(items, with_crc=incremental)

        def write() -> None:
            if incremental and base is not None:
                b = base()
                plan.base = b if b is not None and storage.exists(b) else None
            plan.write(copy, crcs)
            if then is not None:
                then()

        return write

    return stage


def _plan(
    prefix: str,
    values: dict[str, Any],
    graph_json: bytes,
    incremental: bool,
    base: str | None,
    digest: str | None = None,
    compression: str | None = "zstd",
    hashed_prefixes: bool = False,
) -> tuple[storage.SavePlan, list[Any]]:
    parent = os.path.dirname(prefix)
    if parent and not is_url(prefix):
        os.makedirs(parent, exist_ok=True)
    payload = dict(values)
    payload[OBJECT_GRAPH_KEY] = graph_json
    if not incremental or (base is not None and not storage.exists(base)):
        base = None
    return storage.plan_save(
        payload,
        prefix,
        incremental=incremental,
        base=base,
        digest=digest,
        compression=compression,
        hashed_prefixes=hashed_prefixes,
    )


def open_reader(prefix: str, verify: bool = True) -> Any:
    """Lazy reader over the checkpoint at ``prefix`` (raises NotFoundError when absent).
    With ``verify`` (default) every value's crc32c is checked as it is read, so a restore
    never assigns damaged bytes; ``False`` is the explicit opt-out."""
    return storage.open(prefix, verify=verify)


def checkpoint_exists(prefix: str) -> bool:
    """True when ``prefix.index`` exists (the index commits a checkpoint)."""
    return bool(storage.exists(prefix))


def remove_checkpoint(prefix: str) -> None:
    """Delete a checkpoint: index first, so a crash never leaves an index without data."""
    storage.remove(prefix)


def list_names(directory: str) -> list[str]:
    """Names of the files (objects) directly in ``directory``, a local path or a URL, through
    the store's list helper for URLs; [] when the directory does not exist."""
    if not is_url(directory):
        try:
            return os.listdir(directory or ".")
        except OSError:
            return []
    return [n for n in storage.list_url(directory) if not n.endswith("/")]


def list_files_and_dirs(directory: str) -> tuple[list[str], list[str]]:
    """(files, sub-directories) directly in ``directory``, a local path or a URL, from one
    listing; ([], []) when the directory does not exist."""
    if not is_url(directory):
        try:
            with os.scandir(directory or ".") as it:
                ents = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            return [], []
        return [n for n, d in ents if not d], [n for n, d in ents if d]
    names = storage.list_url(directory)
    return [n for n in names if not n.endswith("/")], [n[:-1] for n in names if n.endswith("/")]


def remove_hashed_orphans(directory: str, names: list[str], *, listed: list[str]) -> None:
    """For each checkpoint ``directory/name`` of ``names`` without an index (a removal cut
    short between its index and its shards), remove what it left under its hashed
    directories ``P/HH/`` and the directories that leaves empty (FORMAT.md §3.1.1). For
    checkpoints no save writes any more: on an object store it is ``gc`` of ``P/`` whatever
    the age. ``listed``: the file names of ``directory`` (one whose ``P.index`` is among them
    is kept without a request). Failures are logged."""
    from ..storage.local_gc import gc_hashed_prefix

    have = set(listed)
    for prefix in (os.path.join(directory, n) for n in names if f"{n}.index" not in have):
        try:
            if checkpoint_exists(prefix):
                continue
            if is_url(prefix):
                storage.gc(prefix.rstrip("/") + "/", older_than=0)
            else:
                gc_hashed_prefix(prefix)
        except (OSError, CheckpointError) as e:
            logging.getLogger("shardpoint").warning(
                "%s: could not remove orphaned hashed shards: %s", prefix, e
            )


def read_small(url: str) -> bytes | None:
    """A whole small object of an object store, or None when absent."""
    from ..errors import NotFoundError

    try:
        return bytes(storage.read_object(url)[0])
    except NotFoundError:
        return None


def write_small(url: str, data: bytes) -> None:
    """Put a small object (unconditional overwrite)."""
    storage.write_object(url, data)


def delete_name(path: str) -> None:
    """Delete one file or object (absent is fine)."""
    if is_url(path):
        storage.delete_object(path)
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
