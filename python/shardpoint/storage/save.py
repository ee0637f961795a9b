"""Saving: ``save_file`` and its plan (``plan_save``/``SavePlan``: arguments checked and values
encoded first, then written now or staged for an asynchronous save). What the values may be and
what comes back is described in :mod:`shardpoint.storage.reader`."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import InvalidArgumentError
from .numpy_views import SECTION, plan_views
from .paths import PathLike, StorageOptions, _prefix, _storage, is_url, wants_single_file
from .progress import progress_bar, wanted
from .values import check_user_key, encode, json_depth

if TYPE_CHECKING:
    from .async_save import SaveFuture

__all__ = ["save_file", "plan_save", "SavePlan", "DIGEST_ALGORITHMS", "write_single"]


#: Above this many bytes a checkpoint is split over several shards written by parallel threads.
_BYTES_PER_AUTO_SHARD = 256 << 20
#: Incremental saves give values of at least this many bytes a shard of their own, so that an
#: unchanged value is re-used by linking its shard even when its neighbours changed.
_SOLO_BYTES = 4 << 20


def _opts(compression: str | None, level: int | None) -> tuple[str, int]:
    codec = "none" if compression in (None, "none", False) else str(compression)
    if codec not in ("none", "zstd", "zstd-plain", "zstd-bytegroup", "bytegroup-huffman"):
        raise InvalidArgumentError(
            "compression must be 'none', 'zstd', 'zstd-plain', 'zstd-bytegroup' or "
            f"'bytegroup-huffman', got {compression!r}"
        )
    lvl = _core.DEFAULT_LEVEL if level is None else int(level)
    if not -7 <= lvl <= 22:
        raise InvalidArgumentError(f"zstd level must be in -7..22, got {level}")
    return codec, lvl


def _metadata_json(metadata: Mapping[str, Any] | None) -> str:
    if metadata is None:
        return "{}"
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError("metadata must be a JSON-able mapping")
    json_depth(dict(metadata))
    try:
        return json.dumps(dict(metadata), allow_nan=True)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"metadata is not JSON-serialisable: {e}") from e


def _sections_json(sections: Mapping[str, Any] | None) -> str:
    """The library sections object (FORMAT.md §7) as JSON text; ``""`` when there are none."""
    if not sections:
        return ""
    json_depth(dict(sections))
    return json.dumps(dict(sections), allow_nan=True)


#: strong digest algorithms a save may record (FORMAT.md §7.1)
DIGEST_ALGORITHMS = ("sha256", "blake3")


def _digest(digest: str | None) -> str:
    """The ``digest`` option of a save as the core takes it ("" for none)."""
    if digest is None or digest is False:
        return ""
    if digest is True:
        return "blake3"  # 3x the speed of sha256 here (benches/bench_digest.py)
    if digest not in DIGEST_ALGORITHMS:
        raise InvalidArgumentError(
            f"digest must be None, True or one of {DIGEST_ALGORITHMS}, got {digest!r}"
        )
    return str(digest)


def save_file(
    tensors: Mapping[str, Any],
    prefix: PathLike,
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    shards: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    durable: bool = True,
    chunk_bytes: int | None = None,
    progress: bool | None = None,
    blocking: bool = True,
    incremental: bool = False,
    base: PathLike | None = None,
    _sections: Mapping[str, Any] | None = None,
    storage_options: StorageOptions = None,
    digest: str | None = None,
    single_file: bool | None = None,
    _internal_keys: bool = False,
    delta: bool = False,
    max_chain: int | None = None,
    hashed_prefixes: bool = False,
) -> SaveFuture | None:
    """Save a mapping of keys to arrays/values as checkpoint ``prefix`` (atomically).

    Args:
        tensors: str keys to numpy arrays or typed values (see the module docstring).
        prefix: path prefix; writes ``prefix.index`` and ``prefix.data-*``.
        compression: ``"zstd"`` (default: the best codec per dtype: byte-grouped planes with a
            Huffman-coded exponent plane for floats (``"bytegroup-huffman"``, FORMAT.md §5.1;
            at ``level`` > 1 byte-grouped zstd instead), byte-grouped zstd for other multi-byte
            dtypes, plain zstd for 1-byte ones), ``"zstd-bytegroup"``, ``"bytegroup-huffman"``,
            ``"zstd-plain"`` (no byte grouping) or ``"none"``.
        level: zstd level (default 1, which is also the fastest with the best ratio on weights).
        shards: number of shard files, written by that many threads in parallel (default: one
            per 256 MiB, at most the number of CPUs).
        metadata: JSON-able mapping stored in the index, returned by ``Reader.metadata``.
        durable: fsync shards, index and directory before returning (default). ``False`` is
            for scratch checkpoints and like-for-like comparisons with tools that never fsync.
        chunk_bytes: raw bytes per independently compressed chunk (default 1 MiB).
        progress: show a progress bar (``None``: only when stderr is a terminal; needs tqdm).
        blocking: ``False`` copies the values into reusable host buffers and returns at once
            a :class:`~shardpoint.storage.async_save.SaveFuture` (result ``None``); compression, writing
            and the commit run in the background, in call order (see ``async_save``). The
            values may be modified as soon as the call returns.
        incremental: lay the shards out for incremental saves: every value of 4 MiB or more
            gets a shard file of its own (``shards`` is ignored), so a later save with
            ``base=`` this checkpoint can re-use it whenever that value is unchanged.
        base: an earlier checkpoint (implies ``incremental``): shard files of ``base`` whose
            values are all unchanged (same key, dtype, shape and crc32c of the bytes) are
            hard-linked instead of written again (FORMAT.md §8.1). Deleting ``base`` later
            never affects this checkpoint. A missing or unusable base means a full save.
        _internal_keys: allow keys under the reserved prefix (shardpoint's own entries).
        _sections: reserved for shardpoint's own layers (``shardpoint.torch`` keeps its nesting
            there): stored beside the user metadata, read back by ``Reader.sections``.
        storage_options: credentials/endpoint/knobs when ``prefix`` is an object-store URL
            (docs/OBJECT_STORE.md).
        digest: ``"sha256"`` or ``"blake3"`` (``True``: ``"blake3"``, the faster) records a
            strong digest of every shard file, computed while the bytes are written (no second
            pass), in a manifest in the index (FORMAT.md §7.1); ``Reader.verify(strong=True)``
            checks it. ``None`` (default): crc32c only.
        single_file: write one file at ``prefix`` itself (index and data together, FORMAT.md
            §10) instead of ``prefix.index`` + ``prefix.data-*``. ``None`` (default): only when
            the name ends with ``.pt``, ``.pth``, ``.bin`` or ``.sp``. Local paths only; not
            with ``incremental``/``base``; ``shards`` is ignored (one shard, still encoded in
            parallel).
        delta: with ``base``, store each tensor as whichever is smallest of: the same bytes
            as ``base``'s value of its key, the XOR of its bits with that value, or whole
            (FORMAT.md §11, docs/DELTA.md). Unlike ``base=`` alone the checkpoint then
            *depends* on ``base`` (pinned by its index digest; reads resolve through it, and
            check each rebuilt value's crc32c). Local paths, blocking saves only.
        max_chain: with ``delta``, the longest chain of delta checkpoints below a new one
            (default 8); a save that would make it longer writes a full checkpoint.
        hashed_prefixes: store the shards as ``prefix/HH/data-…`` (``HH``: two hex digits
            hashed from the shard number) instead of ``prefix.data-…``, spreading a save's
            object keys over 256 key prefixes that S3 partitions apart (FORMAT.md §3.1.1,
            docs/OBJECT_STORE.md "Hashed key prefixes"). Off by default: the names change and
            the index is version 2, which readers older than this option refuse. Not with
            ``single_file`` or ``delta``.

    ``prefix`` may be a local path, a ``file://`` URL or an object-store URL (``s3://b/run/ck``):
    shards stream up as multipart uploads and the index is committed last by a conditional put.
    The previous checkpoint at ``prefix`` stays readable until the new one is complete, and
    readers that have it open keep seeing it unchanged.
    """
    if delta:
        if hashed_prefixes:
            raise InvalidArgumentError("delta=True does not take hashed_prefixes=True")
        if base is None or not blocking or incremental or single_file or digest:
            raise InvalidArgumentError(
                "delta=True needs base= and a blocking save without incremental, single_file "
                "or digest"
            )
        from .frameworks import delta_hook

        delta_hook("save_delta")(
            tensors, prefix, base=base, compression=compression, level=level,
            metadata=metadata, durable=durable, chunk_bytes=chunk_bytes,
            max_chain=8 if max_chain is None else max_chain, sections=_sections,
        )  # fmt: skip
        return None
    if _sections is None:  # a user's arrays viewing one buffer: recorded to load as views
        views = plan_views(tensors)
        _sections = None if views is None else {SECTION: views}
    plan, items = plan_save(
        tensors,
        prefix,
        compression=compression,
        level=level,
        shards=shards,
        metadata=metadata,
        durable=durable,
        chunk_bytes=chunk_bytes,
        progress=progress,
        incremental=incremental,
        base=base,
        _sections=_sections,
        storage_options=storage_options,
        digest=digest,
        single_file=single_file,
        _internal_keys=_internal_keys,
        hashed_prefixes=hashed_prefixes,
    )
    if blocking:
        plan.write(items, None)
        return None
    from .async_save import default_saver

    return default_saver().submit(plan.staged(items))


def plan_save(
    tensors: Mapping[str, Any],
    prefix: PathLike,
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    shards: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    durable: bool = True,
    chunk_bytes: int | None = None,
    progress: bool | None = None,
    incremental: bool = False,
    base: PathLike | None = None,
    _sections: Mapping[str, Any] | None = None,
    storage_options: StorageOptions = None,
    digest: str | None = None,
    single_file: bool | None = None,
    _internal_keys: bool = False,
    hashed_prefixes: bool = False,
) -> tuple[SavePlan, list[Any]]:
    """Validate the arguments of :func:`save_file` and encode the values: the plan of the
    save and its items, for callers that stage and write them themselves (asynchronous saves
    of the object graph and of torch state dicts)."""
    p = _prefix(prefix)
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError(
            f"tensors must be a mapping of str to values, got {type(tensors).__name__}"
        )
    codec, lvl = _opts(compression, level)
    items = [encode(check_user_key(k, internal=_internal_keys), v) for k, v in tensors.items()]
    meta = _metadata_json(metadata)
    base_p = None if base is None else _prefix(base)
    if is_url(p) and (incremental or base_p is not None):
        raise InvalidArgumentError(
            f"{p}: incremental saves hard-link local shard files; not available for object stores"
        )
    single = wants_single_file(p, single_file)
    if single and is_url(p):
        if single_file:
            raise InvalidArgumentError(f"{p}: single-file checkpoints are written to local paths")
        single = False  # an object-store URL named like a file: the prefix form, as before
    if single and (incremental or base_p is not None):
        raise InvalidArgumentError(
            f"{p}: incremental saves share shard files; a single-file checkpoint has none to "
            "share (pass single_file=False or a name without a .pt/.pth/.bin/.sp suffix)"
        )
    if single and hashed_prefixes:
        raise InvalidArgumentError(
            f"{p}: a single-file checkpoint has no shard files to spread over hashed prefixes "
            "(pass single_file=False or a name without a .pt/.pth/.bin/.sp suffix)"
        )
    plan = SavePlan(
        p,
        codec,
        lvl,
        chunk_bytes,
        shards,
        durable,
        meta,
        progress,
        incremental,
        base_p,
        _sections_json(_sections),
        _storage(storage_options),
        _digest(digest),
        single,
        bool(hashed_prefixes),
    )
    return plan, items


def write_single(
    tensors: Mapping[str, Any],
    path: PathLike | None,
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    sections: Mapping[str, Any] | None = None,
    durable: bool = True,
    xor_bases: Mapping[str, Any] | None = None,
    _internal_keys: bool = False,
) -> bytes | None:
    """A single-file checkpoint (FORMAT.md §10) of ``tensors``: written to local ``path``, or
    built in memory and returned as bytes when ``path`` is None (no file). ``xor_bases``: per
    key, a 1-d uint8 array of the value's byte length; what is stored under that key is the
    XOR of the value's bytes with it (a delta payload, FORMAT.md §11), computed chunk by chunk
    while encoding, so the XOR is never held whole."""
    codec, lvl = _opts(compression, level)
    items = [encode(check_user_key(k, internal=_internal_keys), v) for k, v in tensors.items()]
    bases = None
    if xor_bases:
        bases = [xor_bases.get(it[0]) for it in items]
    opts: dict[str, Any] = dict(
        codec=codec,
        level=lvl,
        chunk_bytes=int(_core.DEFAULT_CHUNK_BYTES),
        metadata_json="{}",
        sections_json=_sections_json(sections),
        xor_bases=bases,
    )
    if path is None:
        return bytes(_core.encode_single(items, **opts))
    p = _prefix(path)
    if is_url(p):
        raise InvalidArgumentError(f"{p}: single-file checkpoints are written to local paths")
    _core.save(p, items, shards=1, durable=bool(durable), single_file=True, **opts)
    return None


@dataclass
class SavePlan:
    """Everything about one ``save_file`` call except the values: what the background thread
    of an asynchronous save needs to write the staged copy."""

    prefix: str
    codec: str
    level: int
    chunk_bytes: int | None
    shards: int | None
    durable: bool
    metadata_json: str
    progress: bool | None
    incremental: bool = False
    base: str | None = None
    #: library metadata sections (FORMAT.md §7) as JSON text, "" for none
    sections_json: str = ""
    storage_options: dict[str, str] | None = None
    #: strong digest algorithm of the manifest (FORMAT.md §7.1), "" for none
    digest: str = ""
    #: write the single-file form (FORMAT.md §10) at ``prefix`` itself
    single_file: bool = False
    #: name shards ``prefix/HH/data-…`` (FORMAT.md §3.1.1)
    hashed_prefixes: bool = False

    def staged(self, items: list[Any]) -> Any:
        """The ``stage`` callable of ``AsyncSaver.submit``: copy ``items`` into the buffers
        (with crcs when the save is incremental) and return the writer of the copy."""

        def stage(bufs: Any) -> Any:
            copy, crcs = bufs.stage(items, with_crc=self.incremental or self.base is not None)
            return lambda: self.write(copy, crcs)

        return stage

    def write(self, items: list[Any], crcs: list[int] | None) -> None:
        """Write and commit ``items`` (``crcs``: their crc32c, when already known)."""
        cb = int(self.chunk_bytes or _core.DEFAULT_CHUNK_BYTES)
        if self.incremental or self.base is not None:
            _core.save_incremental(
                self.prefix,
                items,
                crcs=crcs,
                base=self.base,
                codec=self.codec,
                level=self.level,
                chunk_bytes=cb,
                solo_bytes=_SOLO_BYTES,
                durable=bool(self.durable),
                metadata_json=self.metadata_json,
                sections_json=self.sections_json,
                digest=self.digest or None,
                hashed_prefixes=self.hashed_prefixes,
            )
            return
        shards = self.shards
        if shards is None:
            total = sum(it[4].nbytes for it in items)
            shards = max(1, min(os.cpu_count() or 1, math.ceil(total / _BYTES_PER_AUTO_SHARD)))
        bar = None
        if wanted(self.progress):
            total = sum(it[4].nbytes for it in items)
            bar = progress_bar(total, f"save {os.path.basename(self.prefix)}")
        try:
            _core.save(
                self.prefix,
                items,
                codec=self.codec,
                level=self.level,
                chunk_bytes=cb,
                shards=int(shards),
                durable=bool(self.durable),
                metadata_json=self.metadata_json,
                sections_json=self.sections_json,
                storage_options=self.storage_options,
                progress=None if bar is None else bar.update,
                digest=self.digest or None,
                single_file=self.single_file,
                hashed_prefixes=self.hashed_prefixes,
            )
        finally:
            if bar is not None:
                bar.close()
