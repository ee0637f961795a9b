"""DCP metadata built on demand from the int64 chunk table (docs/SCALE.md, issue 42): what a
loading rank's open costs is then what it touches, not every rank's chunks.

A version 2 metadata document (:mod:`.dcp_metadata`) keeps every stored chunk of every tensor
in one int64 table. Decoding it into DCP's objects eagerly costs ~4 µs a chunk (1.5 s per
loading rank at 4,096 saving ranks x 100 tensors), although shardpoint's LoadPlanner only
reads the table's rows and touches about two chunks per tensor. Here:

- :class:`LazyChunks` is the ``chunks`` of a ``TensorStorageMetadata``: a mutable sequence of
  ``ChunkStorageMetadata`` backed by the tensor's rows of the table; an element is built when
  read (and kept, so that it stays the same object), the whole list when iterated or changed.
- :class:`DerivedStorageData` is the ``storage_data`` of the ``Metadata``: a mapping from
  ``MetadataIndex`` to the entry key, derived on lookup by the writer's rule (``dcp.py``): a
  tensor saved whole under its name, a shard under ``fqn@o0,o1,...``, a non-tensor under its
  name; the index hint is probed first, then the tensor's rows are searched.

Both behave as the eager list and dict would for anyone else (DCP's ``DefaultLoadPlanner``,
user code iterating chunks): equal to them, and pickled (or copied) as them, so a ``Metadata``
sent to a process without shardpoint needs nothing from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableSequence
from typing import Any, overload

import numpy as np
import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata as _Chunk

__all__ = ["LazyChunks", "DerivedStorageData", "chunk_sizes"]


class LazyChunks(MutableSequence[_Chunk]):
    """The chunks of one stored tensor, built from its ``(n, 2 * dims)`` int64 rows (offsets
    then sizes) as they are read (module docstring). ``rows`` is None once the list was
    changed: the rows then no longer describe it."""

    __slots__ = ("_rows", "_dims", "_built", "_list")

    def __init__(self, rows: np.ndarray, dims: int) -> None:
        if rows.ndim != 2 or rows.shape[1] != 2 * dims:
            raise ValueError(f"chunk rows of shape {rows.shape} for a {dims}-d tensor")
        self._rows: np.ndarray | None = rows
        self._dims = dims
        self._built: dict[int, _Chunk] = {}
        self._list: list[_Chunk] | None = None

    @property
    def rows(self) -> np.ndarray | None:
        """The int64 rows the chunks are built from (read-only view), or None once changed."""
        return self._rows

    def _make(self, i: int) -> _Chunk:
        got = self._built.get(i)
        if got is None:
            assert self._rows is not None
            row = self._rows[i].tolist()
            d = self._dims
            got = _Chunk(offsets=torch.Size(row[:d]), sizes=torch.Size(row[d:]))
            self._built[i] = got
        return got

    def _all(self) -> list[_Chunk]:
        """The whole list, built once (every chunk already handed out kept as it was)."""
        if self._list is None:
            assert self._rows is not None
            d = self._dims
            built = self._built
            self._list = [
                built.get(i) or _Chunk(offsets=torch.Size(r[:d]), sizes=torch.Size(r[d:]))
                for i, r in enumerate(self._rows.tolist())
            ]
        return self._list

    def __len__(self) -> int:
        if self._list is not None:
            return len(self._list)
        assert self._rows is not None
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> _Chunk: ...
    @overload
    def __getitem__(self, i: slice) -> list[_Chunk]: ...
    def __getitem__(self, i: int | slice) -> _Chunk | list[_Chunk]:
        if self._list is not None:
            return self._list[i]
        if isinstance(i, slice):
            return [self._make(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        k = i.__index__()
        if not -n <= k < n:
            raise IndexError("chunk index out of range")
        return self._make(k + n if k < 0 else k)

    def __iter__(self) -> Iterator[_Chunk]:
        return iter(self._all())

    # changes go to the built list; the rows no longer describe it
    def _changed(self) -> list[_Chunk]:
        chunks = self._all()
        self._rows = None
        self._built.clear()
        return chunks

    @overload
    def __setitem__(self, i: int, value: _Chunk) -> None: ...
    @overload
    def __setitem__(self, i: slice, value: Iterable[_Chunk]) -> None: ...
    def __setitem__(self, i: Any, value: Any) -> None:
        self._changed()[i] = value

    def __delitem__(self, i: int | slice) -> None:
        del self._changed()[i]

    def insert(self, index: int, value: _Chunk) -> None:
        self._changed().insert(index, value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyChunks) and self._rows is not None and other._rows is not None:
            return bool(np.array_equal(self._rows, other._rows))
        if isinstance(other, list | tuple | LazyChunks):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it stands for

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self) -> tuple[Any, ...]:
        # a plain list: whoever unpickles a Metadata needs nothing from shardpoint
        return (list, (self._all(),))


def _chunk_position(
    md: _md.TensorStorageMetadata, offset: tuple[int, ...], hint: int | None
) -> bool:
    """Whether ``md`` has a chunk at ``offset``: the hint's position first (DCP's planners give
    each read item the chunk's position), then a search of the rows (or of the chunks)."""
    chunks = md.chunks
    if hint is not None and 0 <= hint < len(chunks) and tuple(chunks[hint].offsets) == offset:
        return True
    rows = chunks.rows if isinstance(chunks, LazyChunks) else None
    if rows is not None:
        d = len(offset)
        if rows.shape[1] != 2 * d:
            return False
        if d == 0:
            return len(rows) > 0
        return bool((rows[:, :d] == np.asarray(offset, dtype=np.int64)).all(axis=1).any())
    return any(tuple(c.offsets) == offset for c in chunks)


def chunk_sizes(md: Any, index: _md.MetadataIndex) -> tuple[int, ...] | None:
    """The sizes of ``md``'s chunk at ``index.offset`` (``index.index`` probed first), or None
    when ``md`` is not tensor metadata or has no such chunk: what the entry stored for it must
    hold (the reader checks it, so that a metadata smaller than the stored value does not
    load a part of it as if it were the whole)."""
    if not isinstance(md, _md.TensorStorageMetadata) or index.offset is None:
        return None
    chunks = md.chunks
    offset = tuple(index.offset)
    hint = index.index
    if hint is not None and 0 <= hint < len(chunks) and tuple(chunks[hint].offsets) == offset:
        return tuple(chunks[hint].sizes)
    rows = chunks.rows if isinstance(chunks, LazyChunks) else None
    if rows is not None:
        d = len(offset)
        if rows.shape[1] != 2 * d:
            return None
        hits = np.flatnonzero((rows[:, :d] == np.asarray(offset, dtype=np.int64)).all(axis=1))
        return tuple(rows[int(hits[0]), d:].tolist()) if len(hits) else None
    for c in chunks:
        if tuple(c.offsets) == offset:
            return tuple(c.sizes)
    return None


def _key_of(fqn: str, md: _md.TensorStorageMetadata, offset: tuple[int, ...]) -> str:
    """The entry key of ``md``'s chunk at ``offset`` (the writer's rule, ``dcp._storage_key``):
    its name when the tensor was saved whole as one chunk, else ``fqn@o0,o1,...``."""
    chunks = md.chunks
    if len(chunks) == 1 and not any(offset) and tuple(chunks[0].sizes) == tuple(md.size):
        return fqn
    return f"{fqn}@{','.join(str(o) for o in offset)}"


class DerivedStorageData(Mapping[_md.MetadataIndex, str]):
    """``storage_data`` of a version 2 metadata document, derived on lookup from
    ``state_dict_metadata`` (module docstring); iterated, it is the eager dict, built once."""

    __slots__ = ("_sdm", "_dict")

    def __init__(self, state_dict_metadata: Mapping[str, Any]) -> None:
        self._sdm = state_dict_metadata
        self._dict: dict[_md.MetadataIndex, str] | None = None

    def __getitem__(self, index: _md.MetadataIndex) -> str:
        if self._dict is not None:
            return self._dict[index]
        md = self._sdm.get(index.fqn) if isinstance(index, _md.MetadataIndex) else None
        if md is None:
            raise KeyError(index)
        if not isinstance(md, _md.TensorStorageMetadata):
            if index.offset is not None:
                raise KeyError(index)
            return index.fqn
        if index.offset is None:
            raise KeyError(index)
        offset = tuple(index.offset)
        if not _chunk_position(md, offset, index.index):
            raise KeyError(index)
        return _key_of(index.fqn, md, offset)

    def _all(self) -> dict[_md.MetadataIndex, str]:
        if self._dict is None:
            out: dict[_md.MetadataIndex, str] = {}
            for fqn, md in self._sdm.items():
                if not isinstance(md, _md.TensorStorageMetadata):
                    out[_md.MetadataIndex(fqn)] = fqn
                    continue
                for c in md.chunks:
                    out[_md.MetadataIndex(fqn, c.offsets)] = _key_of(fqn, md, tuple(c.offsets))
            self._dict = out
        return self._dict

    def __iter__(self) -> Iterator[_md.MetadataIndex]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __bool__(self) -> bool:
        # without building the dict: DCP's readers test ``if not metadata.storage_data``
        return any(
            not isinstance(md, _md.TensorStorageMetadata) or len(md.chunks) > 0
            for md in self._sdm.values()
        )

    def __contains__(self, index: object) -> bool:
        try:
            self[index]
        except (KeyError, TypeError):
            return False
        return True

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (self._all(),))
