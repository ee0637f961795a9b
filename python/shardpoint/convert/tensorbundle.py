"""A reader for TensorFlow checkpoints (TensorBundle V2) that needs no TensorFlow.

The format (the index's LevelDB table, its protobuf entries) and its parsing are in
:mod:`shardpoint.convert.tensorbundle_format`; this module reads the tensors it describes from
the ``P.data-SSSSS-of-NNNNN`` shards, bounds-checked, and hands them to the converter. The
(masked) tensor checksums are returned by :meth:`TensorBundleReader.expected_crc32c` so that a
converter can check them at native speed (the shardpoint writer computes the crc32c of
everything it stores anyway).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from ..errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    NotFoundError,
    UnsupportedFormatError,
)
from ..storage.dtypes import numpy_dtype, shape_problem
from ..storage.file_reads import pread_into
from .base import Source, Spec
from .tensorbundle_format import (
    _MAX_INDEX_BYTES,
    _MAX_NOTES,
    _MAX_SHARDS,
    DT_STRING,
    TABLE_MAGIC,
    TF_DTYPES,
    TF_OTHER_DTYPES,
    BundleEntry,
    _Corrupt,
    _fields,
    _parse_entry,
    _shown,
    _signed64,
    _Table,
    crc32c,
    is_tensorbundle_index,
    mask_crc,
    unmask_crc,
)

__all__ = [
    "TABLE_MAGIC",
    "BundleEntry",
    "TensorBundleReader",
    "crc32c",
    "mask_crc",
    "unmask_crc",
    "is_tensorbundle_index",
    "TF_DTYPES",
]


class TensorBundleReader:
    """The entries of a TensorFlow checkpoint and their bytes, read without TensorFlow.

    ``entries`` holds the tensors in key order; ``notes`` says what was left out and why
    (string tensors such as the object graph, partitioned-variable slices, exotic dtypes): one
    note for each of the first 64 skipped entries (keys cut to 100 characters), then one note
    counting the rest. ``skipped`` holds every skipped entry (string tensors are read from
    there), ``skipped_count`` counts them with the partitioned-variable slices.

    Memory is bounded by the index size ``n`` whatever the index holds: the keys built while
    parsing (expanded bytes, then the kept ``str`` keys) by ``64 MiB + 32 n`` (beyond it the
    index is refused), and everything else the parser keeps (one small record per convertible
    entry, at least 12 index bytes each) by a small multiple of ``n`` (docs/RELIABILITY.md).
    """

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = os.fspath(prefix)
        self.index_path = self.prefix + ".index"
        self.notes: list[str] = []
        self.entries: dict[str, BundleEntry] = {}
        self.skipped: dict[str, BundleEntry] = {}
        self.skipped_count = 0
        self._files: dict[int, tuple[Any, int]] = {}
        try:
            size = os.path.getsize(self.index_path)
            if size > _MAX_INDEX_BYTES:
                raise CorruptCheckpointError(
                    f"{self.index_path}: {size} bytes is too large for a TensorBundle index"
                )
            with open(self.index_path, "rb") as f:
                buf = f.read()
        except FileNotFoundError as e:
            raise NotFoundError(f"{self.index_path}: not found") from e
        table = _Table(self.index_path, buf)
        try:
            self._load(table)
        except _Corrupt as e:
            raise CorruptCheckpointError(
                f"{self.index_path}: corrupt TensorBundle index at offset {e.pos}: {e}"
            ) from None

    def _load(self, table: _Table) -> None:
        items = table.items()
        first = next(items, None)
        if first is None or first[0] != b"":
            raise _Corrupt("missing BundleHeaderProto (the entry under key '')", 0)
        self.num_shards, endianness = 0, 0
        for num, wire, value, _ in _fields(first[1], 0, len(first[1])):
            if num == 1 and wire == 0 and isinstance(value, int):
                self.num_shards = _signed64(value)
            elif num == 2 and wire == 0 and isinstance(value, int):
                endianness = value
        if not 1 <= self.num_shards <= _MAX_SHARDS:
            raise _Corrupt(f"num_shards {self.num_shards} out of range", 0)
        if endianness != 0:
            raise UnsupportedFormatError(
                f"{self.index_path}: big-endian TensorBundle checkpoints are not supported"
            )
        for raw_key, value, block_off in items:
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                key = ""
            if not key or "\0" in key:
                # Partitioned variables store each slice under an OrderedCode-encoded binary key.
                self._skip(f"skipped slice entry {_shown(raw_key)} (partitioned variable)")
                continue
            entry = _parse_entry(key, value)
            reason = self._unsupported(entry)
            if reason:
                self._skip(f"skipped {_shown(key)}: {reason}")
                table.charge(sys.getsizeof(key), block_off)
                self.skipped[key] = entry
            else:
                # the kept key, as Python holds it (up to 4 bytes per character)
                table.charge(sys.getsizeof(key), block_off)
                self.entries[key] = entry
        if self.skipped_count > _MAX_NOTES:
            self.notes.append(
                f"... and {self.skipped_count - _MAX_NOTES} more skipped entries (not listed)"
            )

    def find_entry(self, key: str) -> BundleEntry | None:
        """The index entry of ``key`` whether converted or skipped, or ``None`` (a slice
        entry's binary key, or a key not in the index: then the index is read again,
        streamed, under the same key budget)."""
        if key in self.entries:
            return self.entries[key]
        if key in self.skipped:
            return self.skipped[key]
        wanted = key.encode("utf-8")
        with open(self.index_path, "rb") as f:
            table = _Table(self.index_path, f.read(_MAX_INDEX_BYTES + 1))
        try:
            for raw_key, value, _ in table.items():
                if raw_key == wanted:
                    return _parse_entry(key, value)
        except _Corrupt as e:
            raise CorruptCheckpointError(
                f"{self.index_path}: corrupt TensorBundle index at offset {e.pos}: {e}"
            ) from None
        return None

    def _skip(self, note: str) -> None:
        """Count a skipped entry; note it while fewer than :data:`_MAX_NOTES` were."""
        self.skipped_count += 1
        if self.skipped_count <= _MAX_NOTES:
            self.notes.append(note)

    def _unsupported(self, e: BundleEntry) -> str | None:
        if e.dtype == DT_STRING:
            what = (
                "object graph, a TensorFlow proto"
                if e.key == "_CHECKPOINTABLE_OBJECT_GRAPH"
                else ""
            )
            return f"string tensor{' (' + what + ')' if what else ''} not converted"
        if e.dtype not in TF_DTYPES:
            name = TF_OTHER_DTYPES.get(e.dtype, f"DataType {e.dtype}")
            return f"dtype {name} not supported"
        if e.has_slices:
            return "partitioned variable (stored as slices) not supported"
        if e.unknown_rank:
            return "tensor of unknown rank"
        if not 0 <= e.shard_id < self.num_shards:
            raise CorruptCheckpointError(
                f"{self.index_path}: key {_shown(e.key)}: shard_id {e.shard_id} out of range "
                f"(num_shards {self.num_shards})"
            )
        itemsize = numpy_dtype(TF_DTYPES[e.dtype]).itemsize
        problem = shape_problem(e.shape, 8 * itemsize)
        if problem is not None:
            raise CorruptCheckpointError(
                f"{self.index_path}: key {_shown(e.key)}: shape {list(e.shape)} cannot be "
                f"represented: {problem}"
            )
        want = math.prod(e.shape) * itemsize
        if want != e.size:
            raise CorruptCheckpointError(
                f"{self.index_path}: key {_shown(e.key)}: size {e.size} does not match shape "
                f"{list(e.shape)} of {TF_DTYPES[e.dtype]} ({want} bytes)"
            )
        return None

    def shard_path(self, shard_id: int) -> str:
        """File name of shard ``shard_id`` (``P.data-00000-of-00001``)."""
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def _shard(self, shard_id: int) -> tuple[Any, int]:
        """Shard ``shard_id``'s file, opened once and held, and its size at open."""
        if shard_id not in self._files:
            path = self.shard_path(shard_id)
            try:
                f = open(path, "rb")  # noqa: SIM115 - closed by close()
            except FileNotFoundError as e:
                raise NotFoundError(f"{path}: not found (data shard of {self.index_path})") from e
            self._files[shard_id] = (f, os.fstat(f.fileno()).st_size)
        return self._files[shard_id]

    def expected_crc32c(self, key: str) -> int:
        """The (unmasked) crc32c TensorFlow recorded for ``key``'s bytes."""
        return unmask_crc(self.entries[key].crc32c_masked)

    def read(self, key: str, *, verify: bool = False) -> np.ndarray:
        """``key``'s tensor as a fresh array, read with ``pread`` from the shard held open.

        Not a view of a mapping, as before: a shard cut by another process while a view was
        copied killed the process with SIGBUS; a short read is refused naming the shard and
        key. ``verify`` checks the crc32c in pure Python, which is slow for large tensors;
        converters compare :meth:`expected_crc32c` with the crc the shardpoint writer
        computes instead.
        """
        e = self.entries[key]
        f, size = self._shard(e.shard_id)
        path = self.shard_path(e.shard_id)
        if e.offset + e.size > size:
            raise CorruptCheckpointError(
                f"{path}: key {_shown(key)}: bytes [{e.offset}, "
                f"{e.offset + e.size}) run past the end of the file ({size} bytes)"
            )
        out = np.empty(e.size, dtype=np.uint8)
        if pread_into(f.fileno(), out.data, e.offset) < e.size:
            now = os.fstat(f.fileno()).st_size
            raise CorruptCheckpointError(
                f"{path}: key {_shown(key)}: file is now {now} bytes, {size} when opened, "
                f"but bytes up to offset {e.offset + e.size} are needed: it was truncated "
                "or rewritten in place while being read"
            )
        if verify and crc32c(out.data) != self.expected_crc32c(key):
            raise ChecksumMismatchError(
                f"{path}: checksum mismatch at offset {e.offset} "
                f"(key {_shown(key)}): stored 0x{self.expected_crc32c(key):08x}, "
                f"computed 0x{crc32c(out.data):08x}"
            )
        if e.dtype == 10 and e.size and int(out.max()) > 1:
            raise CorruptCheckpointError(
                f"{self.index_path}: key {_shown(key)}: bool bytes not 0/1"
            )
        return out.view(numpy_dtype(TF_DTYPES[e.dtype])).reshape(e.shape)

    def close(self) -> None:
        """Close the shard files (arrays already returned are the caller's own)."""
        files, self._files = self._files, {}
        for f, _ in files.values():
            f.close()

    def __enter__(self) -> TensorBundleReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBundleSource(Source):
    """A TensorFlow checkpoint as a conversion source; its crc32c values are checked by the
    shardpoint sink against the checksums it computes while writing."""

    format = "tensorflow"

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.bundle = TensorBundleReader(prefix)
        self.notes = list(self.bundle.notes)

    def specs(self) -> list[Spec]:
        out = []
        for key, e in self.bundle.entries.items():
            out.append(Spec(key, TF_DTYPES[e.dtype], e.shape, e.size))
        return out

    def read(self, key: str) -> np.ndarray:
        return self.bundle.read(key)

    def expected_crc32c(self, key: str) -> int | None:
        return self.bundle.expected_crc32c(key)

    def location(self, key: str) -> str:
        e = self.bundle.entries[key]
        return f"{self.bundle.shard_path(e.shard_id)} at offset {e.offset}"

    def close(self) -> None:
        self.bundle.close()
