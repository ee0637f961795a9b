"""Reading: lazy ``open`` and its ``Reader`` (values, slices, stats, verify), ``load_file``.

Values are numpy arrays (any dtype of FORMAT.md §4), typed non-tensor values (bytes, str, int,
float, bool, None, JSON-able dicts/lists) or Python objects stored declaratively (dataclasses,
Namespace, sets, enums, numpy scalars, datetimes, paths...: FORMAT.md §6.1, built back only
from allow-listed types, see ``shardpoint.register_type``), never pickled. What comes back:

- arrays are C-contiguous and little-endian, whatever their input layout (non-contiguous and
  big-endian inputs are converted on save); numpy scalars come back as numpy scalars of their
  dtype, objects as their types;
- uncompressed arrays are zero-copy views of a private copy-on-write mapping of the shard: they
  are writable, writes never reach the file, and they stay valid after the reader is closed.
  Hazard (shared by every mmap reader, numpy.memmap and safetensors included): if another
  program truncates or rewrites a shard file in place while you hold such an array, touching
  the array's pages beyond the new end of file kills the process with SIGBUS. shardpoint never
  does this to its own files (it only creates and unlinks them), but a foreign tool, a partial
  rsync or a full network disk can. ``load_file(..., copy=True)`` / ``open(..., copy=True)``
  read into private memory instead and never map; reading through the library itself (loads,
  ``verify``, slices, compressed values) never faults: a shortened file raises
  ``CorruptCheckpointError`` naming the file and offset;
- compressed arrays are decoded (chunk-parallel, GIL released) into fresh memory;
- bytes → bytes, str → str, int → int, float → float, bool/None/dict/list → via JSON (tuples
  come back as lists).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import _core
from ..errors import CorruptCheckpointError, InvalidArgumentError, InvalidKeyError, NotFoundError
from .collector import collector_paused
from .direct_reads import read_cold_into
from .entry_stats import STATS_FIELDS, EntryInfo, _batches, stats_dict
from .frameworks import _FRAMEWORK_NAMES, _IN_PLACE_READERS, framework_converter, with_delta
from .io_mode import check_io, resolve_io
from .numpy_views import restore_views
from .paths import (
    PathLike,
    StorageOptions,
    _prefix,
    _storage,
    directory_prefix,
    is_url,
    not_found_error,
    remote_lost_index,
)
from .progress import progress_bar, wanted
from .row_reads import read_rows
from .slicing import LazySlice, TensorSlice
from .strong_digest import StrongDigest
from .strong_digest import verify_strong as _verify_strong
from .targets import checked_one_by_one, checked_targets
from .values import check_key, decode_value, json_depth

__all__ = [
    "load_file",
    "open",
    "Reader",
    "EntryInfo",
    "read_ranges_into",
    "STATS_FIELDS",
    "stats_dict",
]


def load_file(
    prefix: PathLike,
    *,
    keys: list[str] | None = None,
    verify: bool = True,
    progress: bool | None = None,
    copy: bool = False,
    storage_options: StorageOptions = None,
    io: str = "auto",
) -> dict[str, Any]:
    """Load a checkpoint (or only ``keys``) into a dict.

    Uncompressed arrays are zero-copy copy-on-write views of the mmapped shards (unless
    ``copy``: then they are read into private memory and nothing stays mapped, so a shard file
    truncated later by another program cannot fault them); compressed ones are decoded in
    parallel. With ``verify`` (default) every value's crc32c is checked, so corrupt bytes raise
    ``ChecksumMismatchError`` instead of being returned; compressed values are always checked.
    ``verify=False`` skips the check of uncompressed values (for data you checked already).
    From an object store every value is fetched with parallel ranged GETs and always
    crc-checked. ``io``: ``"mmap"``, ``"pread"`` (as ``copy=True``) or ``"auto"`` (``pread`` on
    network and FUSE file systems, where mapping faults are slow; :mod:`shardpoint.storage.io_mode`).
    """
    with open(prefix, verify=verify, copy=copy, storage_options=storage_options, io=io) as r:
        return restore_views(r, r.load(keys, progress=progress))  # views of one buffer again


class Reader:
    """A lazily opened checkpoint: the index is searched in place and only the bytes of the
    values you read are touched. Use ``sp.open(prefix)``.

    ``framework`` (safetensors' ``safe_open`` convention) says what tensors come out as:
    ``"np"`` (default) numpy arrays, ``"pt"`` torch CPU tensors (bfloat16/float8 included,
    zero-copy where the array is), ``"jax"`` jax arrays. Non-tensor values are unchanged.

    Every value handed out has its crc32c checked first (``verify=True``, the default; a raw
    value is checked when it is read, and a slice of one checks the crc blocks holding its rows,
    FORMAT.md §3.4, or, without blocks, the whole value once, on the first slice). ``verify=False`` opts out, for callers that verified the checkpoint already.
    ``copy=True`` never hands out views of a mapping (see the module docstring's hazard).
    """

    def __init__(
        self,
        prefix: PathLike,
        *,
        verify: bool = True,
        copy: bool = False,
        storage_options: StorageOptions = None,
        io: str = "auto",
        framework: str = "np",
    ) -> None:
        self._prefix = _prefix(prefix)
        self._open_args = {
            "verify": verify,
            "copy": copy,
            "storage_options": storage_options,
            "io": io,
            "framework": framework,
        }
        self._out = framework_converter(framework)
        self._r: _core.CheckpointReader | _core.RemoteReader | None
        if is_url(self._prefix):
            check_io(io)  # object stores are always read by range
            try:
                self._r = _core.RemoteReader(self._prefix, _storage(storage_options))
            except NotFoundError as e:
                lost = remote_lost_index(self._prefix, storage_options)
                if lost is None:
                    raise
                raise lost from e
        else:
            check_io(io)
            try:
                self._r = _core.CheckpointReader(self._prefix)
            except NotFoundError as e:
                raise not_found_error(self._prefix, e) from e
            # the shard list is only looked at on network mounts (local opens stay ~50 us)
            if not copy and resolve_io(io, self._prefix) == "pread":
                shards = [f for f, _ in self._r.shard_files()]
                copy = io == "pread" or resolve_io(io, self._prefix, files=shards) == "pread"
        self._meta: dict[str, Any] | None = None
        self._sections: dict[str, Any] | None = None
        self._verify = bool(verify)
        self._copy = bool(copy)
        self._sliced_ok: set[str] = set()  # raw keys whose whole-value crc was checked

    #: numpy array -> the framework's tensor (``framework=``); None: numpy out
    _out: Callable[[np.ndarray], Any] | None = None
    #: the options it was opened with: what a pickled reader is reopened with
    _open_args: dict[str, Any] | None = None

    _carry = False  # set by shardpoint.torch: its consumer takes carrier arrays (_carriers)

    @property
    def _carriers(self) -> bool:
        """Whether values are decoded as ``carrier_dtype`` arrays (no ``ml_dtypes`` import)."""
        framework = str((self._open_args or {}).get("framework"))
        return self._carry or _FRAMEWORK_NAMES.get(framework) == "pt"

    def _is_closed(self) -> bool:
        return self._r is None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference: the path and the options it was opened with, never its
        mappings or index (a torch ``DataLoader`` with ``spawn``/``forkserver`` workers pickles
        the dataset holding it). The copy reopens the checkpoint, which validates its index
        and shards again in the process that unpickles it; a closed reader stays closed."""
        return (_reopen, (self._prefix, dict(self._open_args or {}), self._is_closed()))

    def _tensor_out(self, value: Any) -> Any:
        """A value as the reader's framework hands it out."""
        if self._out is not None and isinstance(value, np.ndarray):
            return self._out(value)
        return value

    @property
    def _core(self) -> _core.CheckpointReader | _core.RemoteReader:
        if self._r is None:
            raise InvalidArgumentError(f"checkpoint {self._prefix!r} is closed")
        return self._r

    @property
    def path(self) -> str:
        """The checkpoint prefix."""
        return self._prefix

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the index and shard mappings (arrays already returned stay valid)."""
        self._r = None

    def __len__(self) -> int:
        return len(self._core)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        """All keys, sorted by their UTF-8 bytes."""
        return self._core.keys()

    def prefix(self, key_prefix: str) -> list[str]:
        """Keys starting with ``key_prefix``, in order (binary search + walk)."""
        if not isinstance(key_prefix, str):
            raise InvalidKeyError(f"key prefixes must be str, got {type(key_prefix).__name__}")
        return self._core.keys_with_prefix(key_prefix)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._core

    def __getitem__(self, key: str) -> Any:
        return self._tensor_out(self._value(check_key(key), verify=self._verify))

    def get(self, key: str, default: Any = None, *, verify: bool | None = None) -> Any:
        """The value of ``key``, or ``default`` when it is absent. ``verify`` defaults to the
        reader's setting (crc32c checked)."""
        if key not in self:
            return default
        return self._tensor_out(self._value(key, verify=self._verify if verify is None else verify))

    @property
    def _remote(self) -> bool:
        """Whether values come from an object store (each read is a download of its own)."""
        return isinstance(self._core, _core.RemoteReader)

    def _check_once(self, key: str) -> None:
        """Check a local uncompressed value's crc32c the first time part of it is read (a slice
        cannot be checked alone: the crc covers the whole value); later parts read unchecked
        from the same mapped file. Never used on object stores: there each read is a new
        download, so checking one download says nothing about the next."""
        if self._verify and key not in self._sliced_ok:
            self._core.verify_key(key)
            self._sliced_ok.add(key)

    def _view_checked_once(self, key: str) -> Any:
        """The value of an uncompressed ``key`` for partial reads (``get_slice``): locally a
        zero-copy view, its crc checked on the first such read only; from an object store one
        download of the whole value, checked (the bytes sliced are the bytes checked)."""
        if self._remote:
            return self._value(key, verify=True)
        self._check_once(key)
        return self._value(key, verify=False)

    def _value(self, key: str, verify: bool) -> Any:
        v = self._core.get(key, verify, self._copy)
        return decode_value(self._prefix, key, v, self._carriers)

    def load(
        self,
        keys: list[str] | None = None,
        *,
        verify: bool | None = None,
        progress: bool | None = None,
    ) -> dict[str, Any]:
        """Many values at once (all by default); compressed ones decoded in parallel.
        ``verify`` defaults to the reader's setting; ``progress`` shows a bar (``None``: only
        when stderr is a terminal).

        Memory: decoded values under 8 MiB share one allocation per call (one allocation, not
        one per value); it is freed when the last of those arrays is. Keep a copy of a small value (``a.copy()``) if you keep it
        alone for long. Uncompressed values are copy-on-write views of the mapped shards."""
        verify = self._verify if verify is None else bool(verify)
        ks = self.keys() if keys is None else [check_key(k) for k in keys]
        batches = [ks]
        bar = None
        if wanted(progress):
            sizes = [self._core.info(k).raw_len for k in ks]
            bar = progress_bar(sum(sizes), f"load {os.path.basename(self._prefix)}")
            batches, cur, acc = [], [], 0
            for k, n in zip(ks, sizes, strict=True):  # ~64 MiB per call: the bar moves
                cur.append(k)
                acc += n
                if acc >= 64 << 20:
                    batches.append(cur)
                    cur, acc = [], 0
            batches.append(cur)
        out = {}
        try:
            for batch in batches:
                got = self._core.get_many(batch, verify, self._copy)
                for k, v in zip(batch, got, strict=True):
                    out[k] = self._tensor_out(decode_value(self._prefix, k, v, self._carriers))
                    if bar is not None:
                        bar.update(len(v.buffer))
        finally:
            if bar is not None:
                bar.close()
        return out

    def load_into(self, targets: Mapping[str, np.ndarray], *, verify: bool | None = None) -> None:
        """Decode values straight into existing arrays (``key -> array``), in parallel.

        Each array must be C-contiguous and writable, with the stored dtype and shape. This is
        the load path without fresh memory: no page faults or kernel page clearing for the
        output and no second copy (``load`` + ``np.copyto`` pays both), so a compressed
        checkpoint loads at the decoder's speed into, e.g., a model's parameters.
        ``verify`` defaults to the reader's setting (compressed values are always checked).

        On an error (a bad target, a checksum mismatch) some targets may already hold their
        new values and others not; the files are never modified.
        """
        verify = self._verify if verify is None else bool(verify)
        keys, outs = self._target_buffers(targets)
        self._read_into(keys, outs, verify)

    def _read_into(
        self,
        keys: list[str],
        outs: list[np.ndarray],
        verify: bool,
        threads: int | None = None,
        *,
        buffered: bool = False,
    ) -> None:
        """``load_into``'s read, for byte views already checked against their entries (the
        torch adapter checks shapes and dtypes itself; one check per key, not two).
        ``threads``: decode on that many threads (local checkpoints; default one per CPU).
        A read judged cold takes the cold-read engine unless ``buffered`` (a caller that chose
        its route: the weights iterator's ``direct=False``)."""
        # object stores check every download whatever ``verify`` says (bytes crossed a network)
        core = self._core
        if not isinstance(core, _core.CheckpointReader):
            core.read_many_into(keys, outs, verify)
        elif buffered or not read_cold_into(core, keys, outs, verify, threads):
            core.read_many_into(keys, outs, verify, threads)

    def _target_buffers(
        self, targets: Mapping[str, np.ndarray]
    ) -> tuple[list[str], list[np.ndarray]]:
        """Keys and byte views of ``load_into`` targets, each checked against its stored value
        (a tensor of the same dtype and shape; the array C-contiguous and writable)."""
        with collector_paused():  # a shape and a view per key (storage/collector.py)
            fast = checked_targets(self._r, targets)  # all at once; key by key on any doubt
        return fast if fast is not None else checked_one_by_one(self.info, targets)

    def info(self, key: str) -> EntryInfo:
        """Index record of ``key`` (dtype, shape, codec, sizes, location)."""
        r = self._core.info(check_key(key))
        # positional, in EntryInfo's field order: a plan makes one per key, and keywords
        # cost ~0.5 us of the ~3 (20,000 keys: 10 ms before the first read can start)
        return EntryInfo(
            key, r.dtype, tuple(r.shape), r.kind, r.codec, r.stored_len, r.raw_len,
            r.shard, r.offset, r.crc32c, r.nchunks, r.crc_blocks,
        )  # fmt: skip

    def _infos(self, keys: list[str]) -> list[EntryInfo]:
        """:meth:`info` of each stored key of ``keys`` (a plan's lookups): one core call, where
        an ``info`` per key cost ~3 us (20,000 keys: 60 ms before a load's first read); key by
        key for a subclass with its own ``info`` (a delta, a Hugging Face directory)."""
        bulk = getattr(self._core, "infos", None) if type(self).info is Reader.info else None
        if bulk is None:
            return [self.info(k) for k in keys]
        return [EntryInfo(*t) for t in bulk(keys)]

    def get_slice(self, key: str) -> LazySlice:
        """A lazy view of tensor ``key`` (safetensors' ``safe_open(...).get_slice``): ``shape``,
        ``dtype``, ``get_shape()``, ``get_dtype()`` and numpy-style indexing on every axis that
        reads only the selected bytes (uncompressed) or chunks (compressed). See
        :mod:`shardpoint.storage.slicing` for the index rules."""
        return TensorSlice(self, check_key(key))

    def slice(self, key: str, start: int, stop: int) -> Any:
        """Rows ``start:stop`` along the first axis, reading only the bytes that hold them.
        With ``verify`` they are checked: compressed values by the crcs of the chunks holding
        the rows, uncompressed ones by the crcs of the blocks holding them (FORMAT.md §3.4).
        An uncompressed value without crc blocks (a file from before them, or a value of one
        block) has one crc for all its bytes: its first slice checks it whole, once (locally),
        or every slice downloads the whole value once, checks it and cuts the rows from that
        download (object stores: a download checked is never trusted for the next)."""
        return self._tensor_out(read_rows(self, [(check_key(key), start, stop)])[0])

    def slice_many(self, items: list[tuple[str, int, int]]) -> list[Any]:
        """``[self.slice(key, start, stop) for key, start, stop in items]`` in one call: the
        ranges are read in parallel and, from an object store, fetched together (neighbours in
        a shard share one ranged GET), each checked as :meth:`slice` checks it."""
        rows = read_rows(self, [(check_key(k), a, b) for k, a, b in items])
        return [self._tensor_out(r) for r in rows]

    def _blob(self) -> dict[str, Any]:
        text = self._core.metadata_json()  # checksum errors propagate with their own class
        try:
            with collector_paused():  # one object or more per tensor (storage/collector.py)
                blob = json.loads(text)
            json_depth(blob)
        except (ValueError, RecursionError) as e:
            raise CorruptCheckpointError(
                f"{self._prefix}.index: metadata is not valid JSON: {e}"
            ) from e
        return blob if isinstance(blob, dict) else {}

    @property
    def metadata(self) -> dict[str, Any]:
        """The ``metadata`` mapping given at save time, exactly (shardpoint's own layers keep
        their bookkeeping in :attr:`sections`, never in this dict)."""
        if self._meta is None:
            user = self._blob().get("user", {})
            self._meta = user if isinstance(user, dict) else {}
        return self._meta

    @property
    def sections(self) -> dict[str, Any]:
        """shardpoint's own metadata sections (FORMAT.md §7), by layer name, e.g.
        ``"shardpoint.torch"``; ``{}`` for checkpoints without any."""
        if self._sections is None:
            text = self._blob().get("sections")
            found: Any = {}
            if isinstance(text, str):
                try:
                    with collector_paused():
                        found = json.loads(text)
                    json_depth(found)
                except (ValueError, RecursionError) as e:
                    raise CorruptCheckpointError(
                        f"{self._prefix}.index: metadata sections are not valid JSON: {e}"
                    ) from e
            self._sections = found if isinstance(found, dict) else {}
        return self._sections

    @property
    def format_info(self) -> dict[str, Any]:
        """Writer-level metadata: format version, writer, shards, sizes."""
        blob = json.loads(self._core.metadata_json())
        blob.pop("user", None)
        blob.pop("sections", None)
        # the index header's version (2 when it names hashed shards, FORMAT.md §3.1.1); the
        # metadata's own "format" field is that of the metadata JSON, always 1
        blob["format"] = self._core.format_version()
        blob["shards"] = [(os.fspath(p), n) for p, n in self._core.shard_files()]
        blob["index_bytes"] = self._core.index_size()
        blob["chunk_bytes"] = self._core.chunk_bytes()
        return blob

    def stats(
        self, keys: list[str] | None = None, *, progress: bool | None = None
    ) -> dict[str, dict[str, Any]]:
        """Numerical health of tensors: ``{key: {dtype, shape, count, finite, nan, posinf,
        neginf, zeros, min, max, mean, std, l2}}`` for ``keys`` (default: every tensor; a
        non-tensor key given explicitly is an error).

        Computed in the Rust core in one parallel pass with the decode, GIL released: each
        chunk is decoded into a reused per-thread buffer and folded there (no value is loaded
        whole), and every value's crc32c is checked, so damaged data never yields numbers.
        Accumulation is in float64 (two-pass per block, pairwise merge). ``min``/``max``/
        ``mean``/``std`` (population)/``l2`` are over the finite elements (``None`` when there
        are none); NaN and +/-Inf are counted apart. Complex values count their magnitude;
        ``float4_e2m1fn_x2`` holds two elements per byte. See docs/INSPECT.md.
        """
        if keys is None:
            infos = [self.info(k) for k in self.keys()]
            infos = [i for i in infos if i.kind == "tensor"]
        else:
            infos = [self.info(k) for k in keys]
            for i in infos:
                if i.kind != "tensor":
                    raise InvalidArgumentError(
                        f"key {i.key!r} holds a {i.kind} value, not a tensor"
                    )
        bar = progress_bar(
            sum(i.raw_bytes for i in infos), f"stats {os.path.basename(self._prefix)}",
            progress=progress,
        )  # fmt: skip
        out: dict[str, dict[str, Any]] = {}
        try:
            for batch in _batches(infos, 256 << 20):  # ~256 MiB per call: the bar moves
                if self._remote:
                    tuples = []
                    for i in batch:
                        flat = np.ascontiguousarray(self._value(i.key, True)).reshape(-1)
                        tuples.append(_core.stats_buffer(flat.view(np.uint8), i.dtype))
                else:
                    core = self._core
                    assert isinstance(core, _core.CheckpointReader)
                    tuples = core.stats([i.key for i in batch])
                for i, t in zip(batch, tuples, strict=True):
                    out[i.key] = stats_dict(i.dtype, i.shape, t)
                bar.update(sum(i.raw_bytes for i in batch))
        finally:
            bar.close()
        return out

    def verify(self, *, strong: bool = False, expect: str | None = None) -> StrongDigest | None:
        """Check every checksum and structural invariant, in parallel. Raises on damage.

        ``strong=True`` also re-hashes every shard file against the digest manifest recorded
        at save time (``save_file(..., digest=...)``, FORMAT.md §7.1) and returns a
        :class:`StrongDigest` whose ``root`` is the digest of the index file, which covers every
        shard through the manifest. Raises ``DigestMissingError`` when the checkpoint has no
        manifest, ``DigestMismatchError`` naming the file when one differs. ``expect``: a root
        digest kept somewhere an attacker cannot write (``"sha256:<hex>"`` or bare hex); a
        different root raises ``DigestMismatchError``. crc32c catches accidents; only the
        root compared with ``expect`` (or a signature, ``shardpoint.signing``) tells a
        deliberate rewrite (docs/RELIABILITY.md).
        """
        self._core.verify()
        if not (strong or expect):
            return None
        return _verify_strong(self._core, self._prefix, expect)


def read_ranges_into(
    paths: list[str],
    ranges: list[tuple[int, int]],
    outs: list[np.ndarray],
    threads: int | None = None,
) -> None:
    """Read byte ranges of plain files into existing byte arrays with the bulk-load engine
    (read-ahead, parallel ``pread``, GIL released): ``ranges[i] = (index into paths, offset)``
    fills ``outs[i]`` whole. For formats read in place without checksums (Hugging Face
    safetensors); a range past its file's end raises ``CorruptCheckpointError``.
    ``threads``: read on that many threads (default one per CPU)."""
    _core.read_file_ranges(paths, ranges, outs, threads)


def _reopen(prefix: str, options: dict[str, Any], closed: bool) -> Reader:
    """A pickled reader in the unpickling process: opened afresh, or closed as it was."""
    if not closed:
        return open(prefix, **options)
    r = Reader.__new__(Reader)  # a closed reader touches no file: nothing to open
    r._prefix, r._r, r._open_args = prefix, None, options
    r._out = framework_converter(options.get("framework", "np"))
    r._meta = r._sections = None
    r._verify, r._copy = bool(options.get("verify", True)), bool(options.get("copy", False))
    r._sliced_ok = set()
    return r


def open(  # noqa: A001 - the public name is a contract
    prefix: PathLike,
    *,
    verify: bool = True,
    copy: bool = False,
    storage_options: StorageOptions = None,
    io: str = "auto",
    framework: str = "np",
) -> Reader:
    """Open checkpoint ``prefix`` lazily (reads the index header only; O(1) in the key count).
    ``verify``: check each value's crc32c when it is read (default; ``False`` opts out);
    ``copy``: read values into private memory instead of handing out mapped views;
    ``framework``: what tensors come out as, as safetensors' ``safe_open`` takes it:
    ``"np"`` (numpy, default), ``"pt"`` (torch CPU tensors, bfloat16 included), ``"jax"``.
    From an object store (``s3://bucket/run/ckpt``): one GET of the index; each value is then
    fetched on access.

    ``io``: ``"mmap"`` (zero-copy views), ``"pread"`` (private memory read with large parallel
    ``pread``; same as ``copy=True``), ``"auto"`` (default: ``pread`` on network and FUSE file
    systems, whose mapping faults are remote round trips; see :mod:`shardpoint.storage.io_mode`).

    A single-file checkpoint (``sptorch.save(sd, "model.pt")``, FORMAT.md §10; recognised by
    its first bytes) opens the same way, and ``P.index`` means ``P``.

    A delta checkpoint (``save_file(..., base=B, delta=True)``) opens as a reader that
    resolves each value through its base (``shardpoint.delta.DeltaReader``).

    A Hugging Face safetensors checkpoint (a model directory, its ``*.safetensors.index.json``,
    or a ``.safetensors`` file) opens in place as a read-only Reader (``convert.hf.HFReader``).
    A directory ``shardpoint export`` wrote (``DIR/model.index``), or one holding a single
    checkpoint, opens that checkpoint (``paths.directory_prefix``).
    """
    p = prefix = directory_prefix(os.fspath(prefix))
    if (
        isinstance(p, str)
        and p
        and not is_url(p)
        and not os.path.exists(p + ".index")
        and not _core.is_single_file(p)
        and not (p.endswith(".index") and os.path.isfile(p))
    ):
        for module_name, predicate, reader in _IN_PLACE_READERS:
            module = importlib.import_module(module_name)
            if getattr(module, predicate)(p):
                in_place: Reader = getattr(module, reader)(p, io="pread" if copy else io)
                in_place._out = framework_converter(framework)
                in_place._open_args = {"copy": copy, "io": io, "framework": framework}
                return in_place
    r = Reader(
        prefix, verify=verify, copy=copy, storage_options=storage_options, io=io,
        framework=framework,
    )  # fmt: skip
    return with_delta(r)  # a delta checkpoint (FORMAT.md §11) resolves through its base
