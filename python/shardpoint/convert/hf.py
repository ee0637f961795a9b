"""Hugging Face safetensors checkpoints opened in place: ``sp.open(directory)``.

A Hugging Face model directory is ``model-00001-of-00030.safetensors`` shards plus
``model.safetensors.index.json`` (``{"metadata": {...}, "weight_map": {key: file}}``), or a single
``model.safetensors``. :class:`HFReader` is a read-only :class:`shardpoint.Reader`: opening reads
the index JSON only; a shard's header is read and validated (see :mod:`.hf_format`) the first time
one of its keys is used, and its data is memory-mapped, so a tensor is a zero-copy view of the
pages it occupies and a slice touches only the pages it covers.

The format has no checksums: ``verify()`` checks structure (every header, every weight-map key
present in its shard), not content. ``shardpoint convert DIR PREFIX`` makes a checksummed,
compressed shardpoint checkpoint of it.
"""

from __future__ import annotations

import glob
import mmap
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import _core
from ..errors import (
    CorruptCheckpointError,
    DigestMissingError,
    InvalidArgumentError,
    InvalidKeyError,
    MissingKeyError,
    NotFoundError,
    UnsupportedDTypeError,
)
from ..storage import EntryInfo, Reader, read_ranges_direct, read_ranges_into, stats_dict
from ..storage.collector import collector_paused
from ..storage.direct_reads import judged_cold
from ..storage.dtypes import carrier_dtype, numpy_dtype
from ..storage.io_mode import check_io, resolve_io
from ..storage.progress import progress_bar, wanted
from ..storage.slicing import TensorSlice
from ..storage.strong_digest import StrongDigest
from .base import Source, Spec
from .hf_files import SECTION, collect_files
from .hf_format import ShardHeader, TensorRecord, read_index, read_shard_header
from .safetensors_io import ST_TO_FORMAT

__all__ = ["HFReader", "HFSource", "is_hf_path", "resolve_hf", "INDEX_SUFFIX"]

INDEX_SUFFIX = ".safetensors.index.json"
_DEFAULT_INDEX = "model" + INDEX_SUFFIX
_DEFAULT_FILE = "model.safetensors"


def resolve_hf(path: str) -> tuple[str, str | None, str | None]:
    """``(directory, index json or None, single file or None)`` for what a user passed: a model
    directory, its index JSON, or one ``.safetensors`` file. Raises ``NotFoundError`` when the
    path is none of those."""
    if os.path.isdir(path):
        idx = os.path.join(path, _DEFAULT_INDEX)
        if os.path.isfile(idx):
            return path, idx, None
        single = os.path.join(path, _DEFAULT_FILE)
        if os.path.isfile(single):
            return path, None, single
        found = sorted(glob.glob(os.path.join(glob.escape(path), "*" + INDEX_SUFFIX)))
        if len(found) == 1:
            return path, found[0], None
        files = sorted(glob.glob(os.path.join(glob.escape(path), "*.safetensors")))
        if not found and len(files) == 1:
            return path, None, files[0]
        what = f"{len(found)} index files" if found else f"{len(files)} .safetensors files"
        raise NotFoundError(
            f"{path}: no {_DEFAULT_INDEX} or {_DEFAULT_FILE}, and {what} to choose from"
        )
    if os.path.isfile(path):
        d = os.path.dirname(path) or "."
        if path.endswith(".json"):
            return d, path, None
        return d, None, path
    raise NotFoundError(f"{path}: no such file or directory")


def is_hf_path(path: str) -> bool:
    """Whether ``path`` looks like a Hugging Face checkpoint: a directory holding an index JSON
    or ``.safetensors`` files, an ``*.index.json`` file, or a ``.safetensors`` file (that is not
    also a shardpoint prefix). Cheap: names and stat only."""
    if os.path.isdir(path):
        return bool(
            glob.glob(os.path.join(glob.escape(path), "*" + INDEX_SUFFIX))
            or glob.glob(os.path.join(glob.escape(path), "*.safetensors"))
        )
    if not os.path.isfile(path) or os.path.exists(path + ".index"):
        return False
    return path.endswith(".index.json") or path.endswith(".safetensors")


class _Shard:
    """One shard: its validated header and (``mapped``) a private copy-on-write mapping of
    the whole file. With ``io="pread"`` nothing is mapped: values are read with ``pread``."""

    def __init__(self, number: int, header: ShardHeader, mapped: bool = True) -> None:
        self.number = number
        self.header = header
        self.mm: mmap.mmap | None = None
        if mapped and header.file_size > header.data_start:
            with open(header.path, "rb") as f:
                if os.fstat(f.fileno()).st_size != header.file_size:
                    raise CorruptCheckpointError(f"{header.path}: file changed size while opened")
                # ACCESS_COPY: arrays handed out are writable, and writes never reach the file.
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def _shrunk(sh: _Shard, key: str, end: int, now: int) -> CorruptCheckpointError:
    """The error for ``key`` of a shard file shortened to ``now`` bytes since open."""
    return CorruptCheckpointError(
        f"{sh.header.path}: key {key!r}: file is now {now} bytes but bytes up to offset "
        f"{end} are needed ({sh.header.file_size} when opened): the file was truncated "
        "or rewritten in place after open"
    )


class HFReader(Reader):
    """A Hugging Face safetensors checkpoint (directory, index JSON or single file), read-only
    and lazy. Use ``sp.open(path)``. Keys come from the weight map, in sorted order."""

    def __init__(  # noqa: D107 - class doc above
        self, path: str | os.PathLike[str], *, io: str = "auto"
    ) -> None:
        p = os.fspath(path)
        self._prefix = p
        check_io(io)
        self._r = None
        self._meta = None
        self._dir, self._index, single = resolve_hf(p)
        self._single_header: ShardHeader | None = None
        if self._index is not None:
            weight_map, meta = read_index(self._index)
            self._weight_map = dict(weight_map)
            self._index_meta: dict[str, Any] = dict(meta)
        else:
            assert single is not None
            # A single file has no index: its header is the list of keys (read once, kept).
            self._single_header = read_shard_header(single)
            self._weight_map = {k: os.path.basename(single) for k in self._single_header.tensors}
            self._index_meta = {}
        self._single = single
        self._keys = sorted(self._weight_map)
        self._files = sorted(set(self._weight_map.values()))
        self._file_no = {f: i for i, f in enumerate(self._files)}
        # "pread": values are read into fresh arrays (no mapping; network file systems whose
        # files are not already cached).
        files = [os.path.join(self._dir, f) for f in self._files]
        self._pread = io != "mmap" and resolve_io(io, p, files=files) == "pread"
        self._shards: dict[str, _Shard] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: bytes read so far by the cold-read engine (the weights iterator's ``direct=True``):
        #: by DMA in place, by ``O_DIRECT`` through a bounce buffer, from the page cache
        self.read_kinds: tuple[int, int, int] = (0, 0, 0)

    # --- shards, opened on first use ---------------------------------------------------------
    def _shard(self, fname: str, key: str | None) -> _Shard:
        if self._closed:
            raise InvalidArgumentError(f"checkpoint {self._prefix!r} is closed")
        sh = self._shards.get(fname)
        if sh is not None:
            return sh
        with self._lock:
            sh = self._shards.get(fname)
            if sh is None:
                full = os.path.join(self._dir, fname)
                try:
                    header = self._single_header or read_shard_header(full)
                except NotFoundError:
                    why = f" (holds key {key!r})" if key is not None else ""
                    src = self._index or full
                    raise CorruptCheckpointError(
                        f"{full}: shard named by {src} is missing{why}"
                    ) from None
                sh = _Shard(self._file_no[fname], header, mapped=not self._pread)
                self._shards[fname] = sh
        return sh

    def _locate(self, key: str) -> tuple[_Shard, TensorRecord]:
        if not isinstance(key, str):
            raise InvalidKeyError(f"keys must be str, got {type(key).__name__}")
        fname = self._weight_map.get(key)
        if fname is None:
            raise MissingKeyError(f"key {key!r} not found in {self._index or self._single}")
        sh = self._shard(fname, key)
        rec = sh.header.tensors.get(key)
        if rec is None:
            raise CorruptCheckpointError(
                f"{sh.header.path}: key {key!r}: listed in {self._index} but absent from this shard"
            )
        return sh, rec

    def _record(self, key: str) -> TensorRecord:
        return self._locate(key)[1]

    def first_mismatch(
        self, keys: list[str], dtypes: list[str], shapes: list[tuple[int, ...]]
    ) -> int | None:
        """The index of the first key that is not a stored tensor of that dtype name and
        shape, or ``None``: ``load_into``'s one check of a whole model (the core reader's
        call of the same name), instead of an :meth:`info` per key."""
        for i, (key, dtype, shape) in enumerate(zip(keys, dtypes, shapes, strict=True)):
            fname = self._weight_map.get(key)
            rec = self._shard(fname, key).header.tensors.get(key) if fname else None
            if rec is None or rec.shape != tuple(shape) or ST_TO_FORMAT.get(rec.tag) != dtype:
                return i
        return None

    def _dtype_name(self, key: str, rec: TensorRecord) -> str:
        name = ST_TO_FORMAT.get(rec.tag)
        if name is None:
            raise UnsupportedDTypeError(
                f"key {key!r}: safetensors dtype {rec.tag} has no numpy counterpart in shardpoint"
            )
        return name

    def _view(self, key: str) -> np.ndarray:
        """Zero-copy view of ``key`` over the copy-on-write mapping of its shard (with
        ``io="pread"``: a fresh array read with ``pread``)."""
        sh, rec = self._locate(key)
        dt = (carrier_dtype if self._carriers else numpy_dtype)(self._dtype_name(key, rec))
        if rec.end == rec.begin:
            return np.empty(rec.shape, dtype=dt)
        if self._pread:  # a fresh array of the stored shape and dtype: no target check
            out = np.empty(rec.shape, dtype=dt)
            self._read_into([key], [out.reshape(-1).view(np.uint8)], False)
            return out
        assert sh.mm is not None
        # mm.size() is the mapped file's size now (an fstat of the mapping's own descriptor):
        # a view of pages past a new end of file would kill the process with SIGBUS when
        # touched, so a file shortened since open is an error here (as the core's check_len)
        end, now = sh.header.data_start + rec.end, sh.mm.size()
        if now < end:
            raise _shrunk(sh, key, end, now)
        n = (rec.end - rec.begin) // dt.itemsize
        arr = np.frombuffer(sh.mm, dtype=dt, count=n, offset=sh.header.data_start + rec.begin)
        return arr.reshape(rec.shape)

    # --- the Reader interface ----------------------------------------------------------------
    @property
    def path(self) -> str:
        """What was opened (directory, index JSON or file)."""
        return self._prefix

    @property
    def index_path(self) -> str | None:
        """The index JSON, or ``None`` for a single-file checkpoint."""
        return self._index

    @property
    def directory(self) -> str:
        """The directory holding the shards."""
        return self._dir

    def close(self) -> None:
        """Drop the shard mappings (arrays already returned keep theirs alive)."""
        self._closed = True
        self._shards = {}

    def _is_closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def keys(self) -> list[str]:
        """All keys of the weight map, sorted."""
        return list(self._keys)

    def prefix(self, key_prefix: str) -> list[str]:
        """Keys starting with ``key_prefix``, in order."""
        if not isinstance(key_prefix, str):
            raise InvalidKeyError(f"key prefixes must be str, got {type(key_prefix).__name__}")
        return [k for k in self._keys if k.startswith(key_prefix)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._weight_map

    def __getitem__(self, key: str) -> Any:
        return self._tensor_out(self._view(key))

    def get(self, key: str, default: Any = None, *, verify: bool | None = None) -> Any:
        """The tensor ``key`` (a zero-copy view), or ``default`` when absent. ``verify`` is
        accepted for compatibility: this format has no checksums to check."""
        if key not in self:
            return default
        return self._tensor_out(self._view(key))

    def load(
        self,
        keys: list[str] | None = None,
        *,
        verify: bool | None = None,
        progress: bool | None = None,
    ) -> dict[str, Any]:
        """Many tensors at once (all by default), shard by shard; zero-copy views (``verify``
        is accepted for compatibility: this format has no checksums)."""
        ks = self.keys() if keys is None else list(keys)
        order = sorted(ks, key=lambda k: self._weight_map.get(k, ""))
        bar = None
        if wanted(progress):
            bar = progress_bar(
                sum(self._record(k).end - self._record(k).begin for k in ks),
                f"load {os.path.basename(os.path.normpath(self._dir))}",
            )
        out: dict[str, Any] = {}
        if self._pread:  # one parallel bulk read into fresh arrays
            fresh = {}
            as_dtype = carrier_dtype if self._carriers else numpy_dtype
            for k in order:
                rec = self._record(k)
                fresh[k] = np.empty(rec.shape, dtype=as_dtype(self._dtype_name(k, rec)))
            filled = [k for k, v in fresh.items() if v.nbytes]  # fresh: stored shape, dtype
            self._read_into(filled, [fresh[k].reshape(-1).view(np.uint8) for k in filled], False)
            if bar is not None:
                bar.update(sum(v.nbytes for v in fresh.values()))
                bar.close()
            return {k: self._tensor_out(fresh[k]) for k in ks}
        try:
            for k in order:
                out[k] = self._view(k)
                if bar is not None:
                    bar.update(out[k].nbytes)
        finally:
            if bar is not None:
                bar.close()
        return {k: self._tensor_out(out[k]) for k in ks}

    def load_into(self, targets: Mapping[str, np.ndarray], *, verify: bool | None = None) -> None:
        """Read tensors straight into existing arrays (``key -> array``; C-contiguous, writable,
        the stored dtype and shape), as :meth:`shardpoint.Reader.load_into`: parallel ``pread``
        with read-ahead, no mapping faults and no fresh memory (``verify`` is accepted for
        compatibility: this format has no checksums). A shard shorter than its header says
        raises ``CorruptCheckpointError`` naming it, before anything is read. A large read
        from files mostly not in the page cache (:func:`~shardpoint.storage.direct_reads.
        judged_cold`) goes through the cold-read engine, every piece from the device."""
        keys, outs = self._target_buffers(targets)
        self._read_into(keys, outs, False)

    def _read_into(
        self,
        keys: list[str],
        outs: list[np.ndarray],
        verify: bool,
        threads: int | None = None,
        *,
        buffered: bool = False,
    ) -> None:
        """``load_into``'s read, for byte views already checked (no checksums to verify); a
        read judged cold goes through the cold-read engine unless ``buffered``."""
        nbytes = sum(o.nbytes for o in outs)
        if not buffered and judged_cold(lambda: self._files_of(keys), nbytes):
            self._read_direct(keys, outs, follow_cache=False)
        else:
            self._read_ranges(keys, outs, threads)

    def _read_ranges(self, keys: list[str], outs: list[np.ndarray], threads: int | None) -> None:
        """``keys`` read buffered into ``outs`` (parallel ``pread`` with read-ahead)."""
        paths, ranges = self._ranges(keys)
        try:
            read_ranges_into(paths, ranges, outs, threads)
        except CorruptCheckpointError:
            self._refuse_shrunk(keys)
            raise

    def _read_direct(
        self, keys: list[str], outs: list[np.ndarray], *, follow_cache: bool = True
    ) -> None:
        """:meth:`_read_into` with the cold-read engine
        (:func:`shardpoint.storage.read_ranges_direct`: ``O_DIRECT`` where the pages are not
        cached, or everywhere with ``follow_cache=False``, eight reads in flight, in place where
        an output is placed congruent to its file offset); the bytes read in place, bounced and
        from the page cache are added to :attr:`read_kinds`."""
        paths, ranges = self._ranges(keys)
        try:
            got = read_ranges_direct(paths, ranges, outs, follow_cache=follow_cache)
        except CorruptCheckpointError:
            self._refuse_shrunk(keys)
            raise
        with self._lock:
            a, b, c = self.read_kinds
            self.read_kinds = (a + got[0], b + got[1], c + got[2])

    def _files_of(self, keys: list[str]) -> list[tuple[str, int]]:
        """The shard files holding ``keys``, with their sizes as opened."""
        files = {sh.header.path: sh.header.file_size for sh, _ in map(self._locate, keys)}
        return list(files.items())

    def _refuse_shrunk(self, keys: list[str]) -> None:
        """After a read ran past the end of a file: name the first key whose bytes are no
        longer all in its file (shortened since open), else return (the caller re-raises
        what the read said)."""
        for key in keys:
            sh, rec = self._locate(key)
            end = sh.header.data_start + rec.end
            try:
                now = os.stat(sh.header.path).st_size
            except OSError:
                now = 0
            if now < end:
                raise _shrunk(sh, key, end, now) from None

    def _ranges(self, keys: list[str]) -> tuple[list[str], list[tuple[int, int]]]:
        """The shard files ``keys`` lie in and each key's ``(file index, offset)`` (a tuple per
        key, made with the collector paused: storage/collector.py)."""
        paths: list[str] = []
        file_no: dict[str, int] = {}
        ranges: list[tuple[int, int]] = []
        with collector_paused():
            for key in keys:
                sh, rec = self._locate(key)
                no = file_no.setdefault(sh.header.path, len(paths))
                if no == len(paths):
                    paths.append(sh.header.path)
                ranges.append((no, sh.header.data_start + rec.begin))
        return paths, ranges

    def stats(
        self, keys: list[str] | None = None, *, progress: bool | None = None
    ) -> dict[str, dict[str, Any]]:
        """``Reader.stats`` over the mapped shards: each tensor's bytes are read in place by
        the Rust core (GIL released, parallel pieces); no checksums exist to check here."""
        ks = self.keys() if keys is None else list(keys)
        infos = [self.info(k) for k in ks]
        bar = progress_bar(sum(i.raw_bytes for i in infos), "stats", progress=progress)
        out: dict[str, dict[str, Any]] = {}
        try:
            for i in infos:
                flat = np.ascontiguousarray(self._view(i.key)).reshape(-1).view(np.uint8)
                out[i.key] = stats_dict(i.dtype, i.shape, _core.stats_buffer(flat, i.dtype))
                bar.update(i.raw_bytes)
        finally:
            bar.close()
        return out

    def info(self, key: str) -> EntryInfo:
        """dtype, shape, size and location of ``key`` (``crc32c`` is 0: no checksums)."""
        sh, rec = self._locate(key)
        n = rec.end - rec.begin
        dtype = self._dtype_name(key, rec)
        off = sh.header.data_start + rec.begin
        return EntryInfo(key, dtype, rec.shape, "tensor", "none", n, n, sh.number, off, 0, 1)

    def slice(self, key: str, start: int, stop: int) -> Any:
        """Rows ``start:stop`` along the first axis (a fresh array; only those pages read)."""
        v = self._view(key)
        if not v.shape:
            raise InvalidArgumentError(f"key {key!r}: only tensors with ndim >= 1 can be sliced")
        return self._tensor_out(np.array(v[start:stop]))

    # TensorSlice's hooks: this format has no crc to check before a partial read.
    _verify = False

    def _check_once(self, key: str) -> None:
        self._locate(key)

    def _view_checked_once(self, key: str) -> np.ndarray:
        return self._view(key)

    def get_slice(self, key: str) -> TensorSlice:
        """A lazy slice of ``key`` with exactly ``Reader.get_slice``'s index rules
        (:mod:`shardpoint.storage.slicing`): it indexes the zero-copy view of the mapped shard, so
        only the pages holding selected elements are read."""
        return TensorSlice(self, key)

    @property
    def metadata(self) -> dict[str, Any]:
        """The index's ``metadata`` object (``total_size`` and what the writer added), or the
        single file's ``__metadata__``."""
        if self._single is not None:
            return dict(self._shard(os.path.basename(self._single), None).header.metadata)
        return dict(self._index_meta)

    @property
    def sections(self) -> dict[str, Any]:
        """shardpoint's own metadata sections: none in a Hugging Face checkpoint."""
        return {}

    @property
    def format_info(self) -> dict[str, Any]:
        """Format, index and shard files with their sizes."""
        return {
            "format": "huggingface-safetensors",
            "index": self._index,
            "shards": [
                (os.path.join(self._dir, f), os.path.getsize(os.path.join(self._dir, f)))
                for f in self._files
                if os.path.exists(os.path.join(self._dir, f))
            ],
            "checksums": False,
        }

    def shard_files(self) -> list[str]:
        """The shard file names the weight map uses, sorted."""
        return list(self._files)

    def keys_by_shard(self) -> dict[str, list[str]]:
        """Weight-map keys grouped by shard file, each group in file-offset order once read."""
        out: dict[str, list[str]] = {f: [] for f in self._files}
        for k in self._keys:
            out[self._weight_map[k]].append(k)
        return out

    def verify(self, *, strong: bool = False, expect: str | None = None) -> StrongDigest | None:
        """Check every shard header and that each weight-map key is in its shard. This format
        carries no checksums, so the tensor bytes themselves cannot be checked; ``strong``
        raises ``DigestMissingError`` (no digest manifest: sign the directory instead,
        ``shardpoint sign``)."""
        for k in self._keys:
            self._locate(k)
        if strong or expect:
            raise DigestMissingError(
                f"{self._prefix}: a Hugging Face directory records no digest manifest; "
                "sign it (`shardpoint sign`) or convert it with a digest"
            )
        return None


class HFSource(Source):
    """A Hugging Face checkpoint as a conversion source: shard by shard, in file order, so a
    conversion reads each shard once, sequentially, and releases it before the next."""

    format = "hf"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reader = HFReader(path)
        meta = self.reader._index_meta if self.reader._single is None else self.reader.metadata
        # total_size describes the HF files, not the converted checkpoint.
        self.metadata = {k: v for k, v in meta.items() if k not in ("total_size", "format")}
        # config.json, tokenizer files...: kept with the checkpoint, so export_hf gives back a
        # directory from_pretrained loads (hf_files)
        kept = collect_files(self.reader.directory, self.notes)
        self.sections: dict[str, Any] = {} if kept is None else {SECTION: kept}
        self._specs: list[Spec] = []
        self._last: str | None = None
        for fname, keys in self.reader.keys_by_shard().items():
            sh = self.reader._shard(fname, keys[0] if keys else None)
            recs = [(k, self.reader._record(k)) for k in keys]
            for key, rec in sorted(recs, key=lambda kr: kr[1].begin):
                name = ST_TO_FORMAT.get(rec.tag)
                if name is None:
                    self.notes.append(f"skipped {key!r}: safetensors dtype {rec.tag} not supported")
                    continue
                self._specs.append(Spec(key, name, rec.shape, rec.end - rec.begin))
            # Headers are kept; the mapping of each shard is made again when its turn comes.
            sh.mm = None
            self.reader._shards.pop(fname, None)

    def specs(self) -> list[Spec]:
        return list(self._specs)

    def read(self, key: str) -> Any:
        fname = self.reader._weight_map[key]
        if self._last is not None and self._last != fname:
            self.reader._shards.pop(self._last, None)  # done with that shard: unmap it
        self._last = fname
        return self.reader._view(key)

    def location(self, key: str) -> str:
        return os.path.join(self.reader.directory, self.reader._weight_map.get(key, "?"))

    def close(self) -> None:
        self.reader.close()
