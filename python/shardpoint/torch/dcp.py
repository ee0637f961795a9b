"""``torch.distributed.checkpoint`` storage backend: one shardpoint checkpoint per DCP save.

Save (``dcp.save(state_dict, storage_writer=StorageWriter(prefix))``):

1. the coordinator's ``prepare_global_plan`` tells every rank its rank and the world size;
2. ``write_data`` on every rank, in parallel: a ``sp.Writer(rank=r, world_size=W + 1)`` streams
   the rank's items (compressed, checksummed, several threads) into its own shards and publishes
   its partial index;
3. ``finish`` on the coordinator, after DCP has gathered every rank's results (so every partial
   index exists): DCP's ``Metadata`` is written as a JSON entry by one extra writer (rank ``W``),
   and ``sp.merge(prefix, W + 1)`` merges the partial indexes without copying data and commits
   ``prefix.index`` atomically. Each rank's results carry the bytes of its partial index, so the
   merge takes them from memory rather than reading ``W`` files back (``partials=``). A rank that dies before that leaves the previous checkpoint at
   ``prefix`` untouched.

Keys: a tensor saved whole is stored under its DCP fully-qualified name (``model.l1.weight``),
so ``sp.open(prefix)`` shows a readable checkpoint; a shard of a sharded tensor (DTensor,
ShardedTensor) under ``fqn@o0,o1,...`` (its offsets). Non-tensor items (DCP serializes those
itself with ``torch.save``) are ``bytes`` entries. DCP's ``Metadata`` is the JSON entry
``.dcp_metadata`` plus its chunk table ``.dcp_metadata.chunks`` (:mod:`.dcp_metadata`,
version 2: the chunks in an int64 table, the rest tagged JSON checked by decoding it back; no
``storage_data``, whose keys follow from the chunks by the rule above and are derived on
read, so the coordinator never walks every rank's results). If a custom planner puts objects
JSON cannot describe into the metadata, it is stored pickled as ``.dcp_metadata.pickle``
instead (DCP's own metadata, never tensor data; the default ``FileSystemWriter`` always
pickles it) and a warning says so. ``dcp.save`` returns the ``Metadata`` without
``storage_data``; :class:`StorageReader` ``.read_metadata()`` has it.

For thousands of ranks use :class:`~shardpoint.torch.dcp_planners.SavePlanner` as the planner:
an O(N) global step and a plan cache (docs/SCALE.md).

Load (``dcp.load(state_dict, storage_reader=StorageReader(prefix))``) reshards through DCP's
planner: each read request is a hypercube of one stored tensor; only the rows it needs along the
first dimension are read (``Reader.slice`` decodes only the chunks that hold them; uncompressed
entries are mmapped), and the rest is narrowed in place before the copy into the target.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint import storage as _storage
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.futures import Future

from .. import storage
from ..errors import CorruptCheckpointError, InvalidArgumentError, PickleRefusedError
from .codec import numpy_to_tensor, tensor_to_numpy
from .dcp_checks import check_table_entry
from .dcp_lazy import chunk_sizes
from .dcp_metadata import (
    METADATA_CHUNKS_ENTRY,
    METADATA_ENTRY,
    PICKLED_METADATA_ENTRY,
    decode_metadata,
    encode_metadata,
)
from .dcp_paths import reader_prefix, writer_prefix

__all__ = [
    "StorageWriter",
    "StorageReader",
    "METADATA_ENTRY",
    "METADATA_CHUNKS_ENTRY",
    "PICKLED_METADATA_ENTRY",
]

logger = logging.getLogger("shardpoint")

_MARKER = "shardpoint.torch.dcp"
_DCP_VERSION = "1.0.0"  # the layout version DCP's FileSystemWriter writes in torch 2.x


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RankSlot:
    """Storage part of a rank's save plan: which partial index this rank writes, and the merge
    token shared by every writer of this save (so a stale partial of a crashed save is refused)."""

    rank: int
    world_size: int
    merge_token: str = ""


@dataclass(frozen=True)
class _RankPartial:
    """``storage_data`` of the extra, last ``WriteResult`` of a rank: the bytes of the partial
    index it published, so the coordinator's ``finish`` merges from memory instead of reading
    every rank's partial file back (FORMAT.md §8.4). Never stored in the metadata."""

    rank: int
    data: bytes


#: the ``MetadataIndex`` fqn of a rank's :class:`_RankPartial` result (never a state_dict key:
#: DCP's planners only use ``WriteItem`` indexes, and this one is not in any plan)
_PARTIAL_FQN = "\x00shardpoint.partial_index"


def _gathered_partials(results: list[list[_storage.WriteResult]], world: int) -> list[bytes] | None:
    """Every rank's partial index bytes in rank order, from the last result of each rank
    (one look per rank, not a walk over every result), or ``None`` when any rank sent none
    (results of an older writer: then the merge reads the partial files)."""
    if len(results) != world:
        return None
    parts: list[bytes | None] = [None] * world
    for rank_results in results:
        last = rank_results[-1].storage_data if rank_results else None
        if not isinstance(last, _RankPartial) or not 0 <= last.rank < world:
            return None
        parts[last.rank] = last.data
    return None if any(p is None for p in parts) else [p for p in parts if p is not None]


def _storage_key(item: WriteItem) -> str:
    fqn = item.index.fqn
    td = item.tensor_data
    if td is None:
        return fqn
    offsets = list(td.chunk.offsets)
    if any(offsets) or list(td.chunk.sizes) != list(td.size):
        return f"{fqn}@{','.join(str(o) for o in offsets)}"
    return fqn


class StorageWriter(_storage.StorageWriter):
    """DCP ``StorageWriter`` writing one shardpoint checkpoint at path prefix ``path``.

    Args:
        path: checkpoint prefix (``path.index`` + ``path.data-*``); a ``checkpoint_id`` given
            to ``dcp.save`` replaces it. Parent directories are created. An existing directory
            (what DCP's ``FileSystemWriter`` is given) gets the checkpoint inside it, as the
            prefix ``path/checkpoint``.
        compression, level, chunk_bytes: as :func:`shardpoint.save_file` (default zstd with
            byte grouping; ``"none"`` for mmap-able, zero-copy loads).
        threads: threads (and shard files) per rank writing in parallel (default: up to 4).
        durable: fsync shards and index before the save returns (default).
        storage_options: credentials/endpoint/knobs when ``path`` is an object-store URL
            (``s3://bucket/run/step-100``): each rank streams its shards up in parallel.
        background_cleanup: at a local prefix, let the coordinator's ``finish`` return once
            the merged index is committed and remove the replaced save's files in a background
            thread (``sp.merge(wait_cleanup=False)``, FORMAT.md §8.3): for thousands of ranks,
            where those unlinks are most of an unchanged save's commit. Off by default: a
            directory listed right after the save could still hold files being removed.
        hashed_prefixes: store every rank's shards as ``path/HH/data-…`` (FORMAT.md §3.1.1):
            spreads a save's object keys over 256 prefixes an object store partitions apart
            (docs/OBJECT_STORE.md "Hashed key prefixes"). Off by default.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: str | None = "zstd",
        level: int | None = None,
        chunk_bytes: int | None = None,
        threads: int | None = None,
        durable: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        background_cleanup: bool = False,
        hashed_prefixes: bool = False,
    ) -> None:
        super().__init__()
        self._path = os.fspath(path)  # as given; a directory resolves to a prefix inside it
        self.hashed_prefixes = bool(hashed_prefixes)
        self.prefix = self._resolved()
        self.background_cleanup = bool(background_cleanup)
        self.storage_options = storage_options
        self.compression = compression
        self.level = level
        self.chunk_bytes = chunk_bytes
        self.threads = max(1, threads or min(4, os.cpu_count() or 1))
        self.durable = durable
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self.rank: int | None = None
        self._world: int | None = None
        self._token = ""  # set by the coordinator's prepare_global_plan

    @property
    def checkpoint_id(self) -> str:
        return self.prefix

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self._path = os.fspath(checkpoint_id)
        self.prefix = self._resolved()
        self.save_id = uuid.uuid4().hex
        self._world = None
        self._token = ""

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise InvalidArgumentError(
                "shardpoint's StorageWriter commits one checkpoint for all ranks and needs "
                "use_collectives=True"
            )
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        # each save looks again: the directory may have been created since the constructor
        self.prefix = self._resolved()

    def _resolved(self) -> str:
        # With hashed prefixes the save itself creates the directory ``P/`` (FORMAT.md
        # §3.1.1) before its index exists: a rank setting up later must not take it for a
        # user's directory, so the path stays the prefix there.
        return self._path if self.hashed_prefixes else writer_prefix(self._path)

    def storage_meta(self) -> _md.StorageMeta | None:
        return _md.StorageMeta(checkpoint_id=self.prefix, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        parent = os.path.dirname(self.prefix)
        if parent and not storage.is_url(self.prefix):
            os.makedirs(parent, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self._world = len(plans)
        self._token = self.save_id[:32]
        return [
            dataclasses.replace(plan, storage_data=_RankSlot(i, len(plans), self._token))
            for i, plan in enumerate(plans)
        ]

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> Future[list[_storage.WriteResult]]:
        slot = plan.storage_data
        if not isinstance(slot, _RankSlot):
            raise InvalidArgumentError("save plan was not prepared by shardpoint's StorageWriter")
        # W data writers plus one for the coordinator's metadata entry (written in finish)
        writer = storage.Writer(
            self.prefix,
            compression=self.compression,
            level=self.level,
            shards=self.threads,
            durable=self.durable,
            rank=slot.rank,
            world_size=slot.world_size + 1,
            chunk_bytes=self.chunk_bytes,
            metadata={_MARKER: {"version": 1, "metadata_entry": METADATA_ENTRY}},
            merge_token=slot.merge_token,
            storage_options=self.storage_options,
            hashed_prefixes=self.hashed_prefixes,
        )

        def write_one(item: WriteItem) -> _storage.WriteResult:
            key = _storage_key(item)
            data = planner.resolve_data(item)  # resolved lazily: it may allocate (GPU -> host)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                writer.add(key, raw)
                return _storage.WriteResult(item.index, len(raw), key)
            array = tensor_to_numpy(data, carrier=True)
            writer.add(key, array)
            return _storage.WriteResult(item.index, array.nbytes, key)

        # big items first so the threads finish together
        items = sorted(plan.items, key=lambda it: -(it.tensor_storage_size() or 0))
        try:
            with ThreadPoolExecutor(self.threads) as pool:
                results = list(pool.map(write_one, items))
            partial = writer.commit_partial()
        except BaseException:
            writer.abort()
            raise
        if partial is not None:
            # the partial index rides to the coordinator with the results DCP gathers anyway
            # (its ~5 KB per rank), last so finish finds it without walking the others
            index = _md.MetadataIndex(_PARTIAL_FQN)
            results.append(_storage.WriteResult(index, 0, _RankPartial(slot.rank, partial)))
        fut: Future[list[_storage.WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: _md.Metadata, results: list[list[_storage.WriteResult]]) -> None:
        world = self._world if self._world is not None else len(results)
        # no storage_data: the keys follow from the chunks (encode_metadata), so the
        # coordinator does not walk every rank's results
        metadata.storage_data = None
        metadata.version = _DCP_VERSION
        metadata.storage_meta = self.storage_meta()
        writer = storage.Writer(
            self.prefix,
            # the chunk table is regular int64s: byte-grouped zstd stores 4,096 ranks x 100
            # tensors' 13 MB in ~13 KB (decoded in ~5 ms), and every loading rank reads it
            compression="zstd",
            durable=self.durable,
            rank=world,
            world_size=world + 1,
            chunk_bytes=self.chunk_bytes,
            merge_token=self._token,
            storage_options=self.storage_options,
            hashed_prefixes=self.hashed_prefixes,
        )
        try:
            encoded = encode_metadata(metadata)
            if encoded is not None:
                writer.add(METADATA_ENTRY, encoded[0])
                writer.add(METADATA_CHUNKS_ENTRY, encoded[1])
            else:
                metadata.storage_data = {
                    wr.index: wr.storage_data
                    for rank in results
                    for wr in rank
                    if not isinstance(wr.storage_data, _RankPartial)
                }
                logger.warning(
                    "DCP metadata of %s holds objects JSON cannot describe (custom planner "
                    "data?); storing DCP's Metadata pickled in %r (tensor data is never "
                    "pickled)",
                    self.prefix,
                    PICKLED_METADATA_ENTRY,
                )
                writer.add(PICKLED_METADATA_ENTRY, pickle.dumps(metadata))
            own = writer.commit_partial()
        except BaseException:
            writer.abort()
            raise
        # merged from the partials the ranks sent when all did (no N file reads), else read
        ranks = _gathered_partials(results, world)
        storage.merge(
            self.prefix,
            world + 1,
            durable=self.durable,
            token=self._token or None,
            storage_options=self.storage_options,
            wait_cleanup=not self.background_cleanup,
            hashed_prefixes=self.hashed_prefixes,
            partials=None if ranks is None or own is None else [*ranks, own],
        )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        # never claim arbitrary paths for DCP's automatic storage selection
        return False


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------


class StorageReader(_storage.StorageReader):
    """DCP ``StorageReader`` for checkpoints written by :class:`StorageWriter`.

    Args:
        path: checkpoint prefix (a ``checkpoint_id`` given to ``dcp.load`` replaces it), or a
            directory a :class:`StorageWriter` saved into (its ``path/checkpoint``).
        verify: check the crc32c of every value read (compressed values are always checked;
            a row slice checks the chunks it decodes, or the crc blocks it reads of an
            uncompressed value: FORMAT.md §3.4).
        allow_pickle: unpickling runs code chosen by whoever wrote the file, so by default
            nothing read from the checkpoint is unpickled beyond what
            ``torch.load(weights_only=True)`` accepts: DCP's non-tensor items (ints, lists,
            dicts, tensors...) are first checked with that restricted unpickler, and a
            ``.dcp_metadata.pickle`` entry is refused. ``True`` (for checkpoints you trust)
            lets both through; the refusal is a ``PickleRefusedError`` naming this option.
        storage_options: credentials/endpoint/knobs when ``path`` is an object-store URL.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = True,
        allow_pickle: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.prefix = reader_prefix(os.fspath(path))
        self.storage_options = storage_options
        self.verify = verify
        self.allow_pickle = bool(allow_pickle)
        self.load_id = uuid.uuid4().hex
        self.storage_data: Mapping[Any, str] = {}
        self._described: Mapping[str, Any] = {}  # the metadata's state_dict_metadata
        self._reader: storage.Reader | None = None

    @property
    def checkpoint_id(self) -> str:
        return self.prefix

    def _open(self) -> storage.Reader:
        if self._reader is None:
            # ``verify`` reaches slices too: a row slice reads and checks only the crc blocks
            # (uncompressed) or chunks (compressed) holding its rows
            self._reader = storage.open(
                self.prefix, verify=self.verify, storage_options=self.storage_options
            )
            self._reader._carry = True  # bfloat16/float8 as torch views them: no ml_dtypes
        return self._reader

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.prefix = reader_prefix(os.fspath(checkpoint_id))
        self._reader = None
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> _md.Metadata:
        reader = self._open()
        if METADATA_ENTRY in reader:
            # both entries in one call: they sit side by side in the coordinator's shard, so
            # an object store answers them with one ranged GET (open: index + metadata)
            keys = [METADATA_ENTRY]
            if METADATA_CHUNKS_ENTRY in reader:
                check_table_entry(self.prefix, reader.info(METADATA_CHUNKS_ENTRY), len(reader))
                keys.append(METADATA_CHUNKS_ENTRY)
            got = reader.load(keys, verify=True, progress=False)
            table = got.get(METADATA_CHUNKS_ENTRY)
            if table is not None and reader.info(METADATA_CHUNKS_ENTRY).codec == "none":
                # a copy of an uncompressed table (checkpoints before it was compressed): a
                # view would keep the shard mapped while the decoded rows live (the lazy
                # chunks are built from them); a compressed one was decoded into new memory
                table = np.array(table, copy=True)
            try:
                metadata = decode_metadata(got[METADATA_ENTRY], table)
            except CorruptCheckpointError as e:
                # the document's errors name its entry and field; the checkpoint too here
                raise type(e)(f"{self.prefix}: {e}") from None
        elif PICKLED_METADATA_ENTRY in reader:
            # DCP's own metadata from a custom planner (see the module docstring): a pickle,
            # so only with the caller's explicit consent
            if not self.allow_pickle:
                raise PickleRefusedError(
                    f"{self.prefix}: DCP metadata is stored pickled ({PICKLED_METADATA_ENTRY!r}, "
                    "written for a custom planner); unpickling can run arbitrary code, so it is "
                    "refused. Pass StorageReader(..., allow_pickle=True) if you trust this "
                    "checkpoint"
                )
            metadata = pickle.loads(reader.get(PICKLED_METADATA_ENTRY, verify=True))
        else:
            raise CorruptCheckpointError(
                f"{self.prefix} is not a torch.distributed.checkpoint save written by "
                f"shardpoint.torch.StorageWriter (no {METADATA_ENTRY} entry); open it with "
                "sp.open() or shardpoint.torch.load() instead"
            )
        if metadata.storage_meta is None:
            metadata.storage_meta = _md.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: _md.Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if not metadata.storage_data:
            raise CorruptCheckpointError("DCP metadata has no storage_data")
        self.storage_data = metadata.storage_data
        self._described = metadata.state_dict_metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _check_restricted_pickle(self, key: str, raw: bytes) -> None:
        """Refuse a non-tensor item unless ``torch.load(weights_only=True)`` accepts it: DCP's
        planner unpickles it with the unrestricted unpickler, and a pickle the restricted one
        accepts references only allowlisted callables, so that is then safe."""
        try:
            torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise PickleRefusedError(
                f"{self.prefix}: item {key!r} is a pickle that torch.load(weights_only=True) "
                f"refuses ({e}); unpickling it could run arbitrary code. Pass "
                "StorageReader(..., allow_pickle=True) if you trust this checkpoint"
            ) from e

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            self._read_items(plan, planner)
        finally:
            # this rank's reads are done: close the files now, not when the StorageReader
            # is garbage-collected (a later call reopens them)
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _prefetch(
        self, reader: storage.Reader, plan: LoadPlan
    ) -> tuple[dict[str, Any], dict[tuple[str, int, int], Any]]:
        """Everything this plan reads, in two batched calls: the values read whole (by key)
        and the row ranges (by ``(key, start, stop)``) of the values read in part. A row
        range reads, and with ``verify`` checks, only the chunks or crc blocks holding its
        rows (FORMAT.md §3.4). From an object store every range goes into the one call, whole
        values as ranges of all their rows, so neighbouring reads of a shard share one ranged
        GET and a rank costs about one request per shard it touches; locally whole values are
        loaded as such (zero-copy views of uncompressed ones)."""
        remote = storage.is_url(self.prefix)
        whole: dict[str, None] = {}
        rows: dict[tuple[str, int, int], None] = {}
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                continue
            key = self.storage_data[req.storage_index]
            shape = list(reader.info(key).shape)
            self._check_stored_shape(req.storage_index, key, shape)
            entire = not any(req.storage_offsets) and list(req.lengths) == shape
            if not shape or (entire and not remote):
                whole[key] = None
            else:
                start = int(req.storage_offsets[0])
                rows[(key, start, start + int(req.lengths[0]))] = None
        got = reader.load(list(whole), verify=self.verify, progress=False) if whole else {}
        ranges = list(rows)
        return got, dict(zip(ranges, reader.slice_many(ranges), strict=True))

    def _check_stored_shape(self, index: Any, key: str, shape: list[int]) -> None:
        """Refuse an entry whose shape is not its chunk's in the metadata: a request reads
        the chunk's part of the entry, so a metadata describing less than was stored would
        otherwise load that part as the whole, silently."""
        sizes = chunk_sizes(self._described.get(index.fqn), index)
        if sizes is not None and list(sizes) != shape:
            raise CorruptCheckpointError(
                f"{self.prefix}: entry {key!r} holds shape {tuple(shape)}, the metadata's "
                f"chunk of {index.fqn!r} at offsets {tuple(index.offset)} has sizes {sizes}"
            )

    def _read_items(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        reader = self._open()
        whole, rows = self._prefetch(reader, plan)
        for req in plan.items:
            key = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                raw = reader.get(key, verify=True)
                if not self.allow_pickle:
                    self._check_restricted_pickle(key, raw)
                planner.load_bytes(req, io.BytesIO(raw))
                continue
            value = whole.get(key)
            first = 0
            if value is None:
                start = int(req.storage_offsets[0])
                value = rows[(key, start, start + int(req.lengths[0]))]
                first = 1
            source = numpy_to_tensor(value)
            offsets = zip(req.storage_offsets, req.lengths, strict=True)
            for dim, (o, n) in enumerate(offsets):
                if dim >= first and (o > 0 or n < source.shape[dim]):
                    source = source.narrow(dim, o, n)
            target = planner.resolve_tensor(req).detach()
            if target.size() != source.size():
                raise CorruptCheckpointError(
                    f"{self.prefix}: read request for {key!r} expects {tuple(target.size())}, "
                    f"the stored slice has {tuple(source.size())}"
                )
            target.copy_(source)
            planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            with storage.open(reader_prefix(os.fspath(checkpoint_id))) as reader:
                return METADATA_ENTRY in reader or PICKLED_METADATA_ENTRY in reader
        except Exception:  # noqa: BLE001 - "not ours" for any path DCP probes
            return False
