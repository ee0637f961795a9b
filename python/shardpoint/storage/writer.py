"""Writing without a whole dict in memory: the streaming and multi-writer ``Writer``, and
``merge``, the commit of a multi-writer save."""

from __future__ import annotations

import atexit
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError
from .paths import PathLike, StorageOptions, _prefix, _storage
from .save import _digest, _metadata_json, _opts, _sections_json
from .values import check_user_key, encode

__all__ = ["Writer", "merge", "wait_for_cleanups"]

# A background cleanup (``merge(wait_cleanup=False)``, opt-in) holds the prefix's commit lock until it
# is done; let it finish before the interpreter exits rather than leave its files to ``gc``.
atexit.register(_core.wait_for_cleanups)


class Writer:
    """Streaming writer: values are written as they are added (nothing is held in memory), then
    ``commit()`` makes the checkpoint visible atomically. Used as a context manager it commits on
    success and discards everything on an exception.

    Several writers (ranks/processes) build one checkpoint by passing ``rank`` and
    ``world_size``: each writes its own shards and a partial index on ``commit()``, and one of
    them calls :func:`merge` after all have committed. Give every writer of one save the same
    ``merge_token`` (e.g. the step): the merge then refuses a stale partial index left by an
    earlier, crashed save instead of mixing two saves. ``add`` may be called from several threads
    at once; each call writes to a free shard (``shards`` of them) with the GIL released.
    ``digest`` (``"sha256"``/``"blake3"``) records strong digests of the shard files as
    :func:`save_file` does; a merged checkpoint keeps them when every writer recorded them.
    ``hashed_prefixes=True`` stores the shards under hashed key prefixes ``<prefix>/HH/data-…``
    (docs/OBJECT_STORE.md, "Hashed key prefixes"; FORMAT.md §3.1.1), for saves whose request
    rate one object-store prefix cannot take; off by default (readers need version 2). A writer
    of several (``world_size > 1``) then publishes its partial index at
    ``<prefix>/HH/index.part-…`` too: pass ``hashed_prefixes=True`` to :func:`merge`.
    """

    def __init__(
        self,
        prefix: PathLike,
        *,
        compression: str | None = "zstd",
        level: int | None = None,
        shards: int = 1,
        durable: bool = True,
        rank: int = 0,
        world_size: int = 1,
        metadata: Mapping[str, Any] | None = None,
        chunk_bytes: int | None = None,
        merge_token: str | None = None,
        _sections: Mapping[str, Any] | None = None,
        storage_options: StorageOptions = None,
        digest: str | None = None,
        hashed_prefixes: bool = False,
    ) -> None:
        self.prefix = _prefix(prefix)
        codec, lvl = _opts(compression, level)
        self.rank, self.world_size = int(rank), int(world_size)
        self._w: _core.Writer | None = _core.Writer(
            self.prefix,
            codec=codec,
            level=lvl,
            chunk_bytes=int(chunk_bytes or _core.DEFAULT_CHUNK_BYTES),
            shards=int(shards),
            durable=bool(durable),
            rank=self.rank,
            world_size=self.world_size,
            metadata_json=_metadata_json(metadata),
            merge_token="" if merge_token is None else str(merge_token),
            sections_json=_sections_json(_sections),
            storage_options=_storage(storage_options),
            digest=_digest(digest) or None,
            hashed_prefixes=bool(hashed_prefixes),
        )

    def _writer(self) -> _core.Writer:
        if self._w is None:
            raise InvalidArgumentError(
                f"writer for {self.prefix!r} is already committed or aborted"
            )
        return self._w

    def add(self, key: str, value: Any) -> None:
        """Write one value now."""
        self._add(key, value)

    def _add(self, key: str, value: Any, *, internal: bool = False, xor_base: Any = None) -> None:
        """``add``; ``internal``: a key under the reserved prefix (the library's own entries);
        ``xor_base``: bytes (a 1-d uint8 array of the value's byte length) whose XOR with the
        value is what is stored (a delta payload, FORMAT.md §11), computed chunk by chunk."""
        k, dtype, kind, shape, data = encode(check_user_key(key, internal=internal), value)
        self._writer().add(k, dtype, kind, list(shape), data, xor_base)

    __setitem__ = add

    def commit(self) -> None:
        """Make the checkpoint visible (or, with several writers, publish this partial index)."""
        w = self._writer()
        try:
            w.commit()
        finally:
            self._w = None

    def commit_partial(self) -> bytes | None:
        """:meth:`commit`, returning the bytes of the partial index this writer published
        (``world_size > 1``; ``None`` for a single writer). Handed to the coordinator, they let
        :func:`merge` (``partials=``) merge from memory instead of reading every partial back;
        the partial is published all the same."""
        w = self._writer()
        try:
            return w.commit_partial()
        finally:
            self._w = None

    def abort(self) -> None:
        """Discard everything written; the previous checkpoint at the prefix is untouched.
        ``add`` calls running on other threads stop at their next chunk."""
        if self._w is not None:
            self._w.cancel()
            self._w.abort()
            self._w = None

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def merge(
    prefix: PathLike,
    world_size: int,
    *,
    durable: bool = True,
    token: str | None = None,
    storage_options: StorageOptions = None,
    wait_cleanup: bool = True,
    hashed_prefixes: bool = False,
    partials: Sequence[bytes] | None = None,
) -> None:
    """Commit a multi-writer save: merge the ``world_size`` partial indexes into ``prefix.index``
    (no data is copied). ``hashed_prefixes``: the writers' option (``Writer(...,
    hashed_prefixes=True)`` publishes its partial index at ``prefix/HH/index.part-…``,
    FORMAT.md §3.1.1); the merge reads partials in that form only, and a partial found in the
    other form is an error saying which to pass. Duplicate keys across writers raise ``DuplicateKeyError``; partials
    whose ``merge_token`` differs from each other (or from ``token``, when given) raise
    ``InvalidArgumentError`` and nothing is committed.

    Returns once the merged index is committed and the files it made unreferenced (the
    consumed partial indexes, the replaced checkpoint's shards) are removed.
    ``wait_cleanup=False`` (for a coordinator of thousands of ranks, where those unlinks are
    most of an unchanged save's commit) returns once the index is committed and, at a local
    prefix, leaves the removal to a background thread that holds the prefix's commit lock
    until it is done: the next save, ``remove`` or ``gc`` at that prefix waits for it, readers
    never see those files, and a process that dies first leaves them to the next commit or
    ``gc`` (FORMAT.md §8.3); :func:`wait_for_cleanups` waits for every pending one (it also
    runs at interpreter exit). An object store's cleanup (bulk deletes) is always done before
    returning.

    The process remembers the entry order of its last merge at each prefix (a few prefixes):
    when the next save there writes the same keys, each partial's entries are written to the
    places that order gives them right after the partial is read (validated as always), then
    every key is checked to be above the one before it, instead of merged through a heap; any
    change of layout fails that check and the heap merges. The index is the same bytes either
    way.

    ``partials``: every writer's partial index bytes, rank by rank, as
    :meth:`Writer.commit_partial` returned them (``len(partials) == world_size``): merged from
    memory instead of read back (for thousands of ranks, reading the files is most of the
    merge), with the same checks (crcs, key order, shard bounds, ``token``); an error names
    the partial as ``<its path> (in memory)``. The published partials are removed as usual."""
    if partials is not None:
        if len(partials) != int(world_size):
            raise InvalidArgumentError(
                f"{prefix}: merge of {world_size} writers was given {len(partials)} partial indexes"
            )
        _core.merge_in_memory(
            _prefix(prefix),
            [bytes(p) for p in partials],
            durable=bool(durable),
            token=token,
            storage_options=_storage(storage_options),
            wait_cleanup=bool(wait_cleanup),
            hashed_prefixes=bool(hashed_prefixes),
        )
        return
    _core.merge(
        _prefix(prefix),
        int(world_size),
        durable=bool(durable),
        token=token,
        storage_options=_storage(storage_options),
        wait_cleanup=bool(wait_cleanup),
        hashed_prefixes=bool(hashed_prefixes),
    )


def wait_for_cleanups() -> None:
    """Wait until every background cleanup this process started (``merge`` at a local prefix)
    has removed its files. Called at interpreter exit; call it before listing a checkpoint's
    directory right after a merge."""
    _core.wait_for_cleanups()
