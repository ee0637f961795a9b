"""DCP's ``Metadata`` as a shardpoint entry (the codec of :mod:`.dcp`): tagged JSON for the
small parts, an int64 chunk table for the chunks.

Version 1 (still read) was one tagged-JSON document of the whole ``Metadata``, checked by
decoding it back and comparing: about 8 µs per chunk on the coordinator, 30 s for 4,096 ranks ×
100 tensors (docs/SCALE.md). Version 2 puts the chunks (ranks × tensors of them) in the table,
built in one pass and reused while the planner hands back the same cached ``Metadata``; only
the small rest goes through the tagged encoder and its check.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import operator
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import metadata as _md

from .._core import int_attr_rows
from ..errors import CorruptCheckpointError, UnsupportedFormatError
from .dcp_checks import MAX_DIMS, check_decoded, check_properties, check_version
from .dcp_lazy import DerivedStorageData, LazyChunks

__all__ = [
    "METADATA_ENTRY",
    "METADATA_CHUNKS_ENTRY",
    "PICKLED_METADATA_ENTRY",
    "encode_metadata",
    "decode_metadata",
]

METADATA_ENTRY = ".dcp_metadata"
#: the chunk table of a version 2 metadata document (int64: offsets then sizes per chunk)
METADATA_CHUNKS_ENTRY = ".dcp_metadata.chunks"
PICKLED_METADATA_ENTRY = ".dcp_metadata.pickle"
_MARKER = "shardpoint.torch.dcp"


# --------------------------------------------------------------------------------------------

_DATACLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        _md.Metadata,
        _md.TensorStorageMetadata,
        _md.BytesStorageMetadata,
        _md.ChunkStorageMetadata,
        _md.TensorProperties,
        _md.StorageMeta,
    )
}


def _encode(value: Any) -> Any:
    """Tagged JSON for the object graph of a DCP ``Metadata`` (TypeError on anything else)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float": repr(value)}
    if isinstance(value, torch.Size):
        return {"__size": list(value)}
    if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
        return {"__torch": str(value).removeprefix("torch.")}
    if isinstance(value, pathlib.PurePath):
        return {"__path": os.fspath(value)}
    if isinstance(value, tuple):
        return {"__tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {"__dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, _md.MetadataIndex):
        return {"__index": [value.fqn, _encode(value.offset), value.index]}
    cls = _DATACLASSES.get(type(value).__name__)
    if cls is type(value):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(cls)}
        return {"__dc": cls.__name__, "fields": fields}
    raise TypeError(f"cannot describe {type(value).__module__}.{type(value).__name__} in JSON")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__float" in value:
        return float(value["__float"])
    if "__size" in value:
        return torch.Size(value["__size"])
    if "__torch" in value:
        obj = getattr(torch, str(value["__torch"]), None)
        if not isinstance(obj, torch.dtype | torch.layout | torch.memory_format):
            raise CorruptCheckpointError(f"unknown torch constant {value['__torch']!r}")
        return obj
    if "__path" in value:
        return pathlib.Path(value["__path"])
    if "__tuple" in value:
        return tuple(_decode(v) for v in value["__tuple"])
    if "__dict" in value:
        return {_hashable(_decode(k)): _decode(v) for k, v in value["__dict"]}
    if "__index" in value:
        fqn, offset, index = value["__index"]
        return _md.MetadataIndex(fqn, _decode(offset), index)
    if "__dc" in value:
        cls = _DATACLASSES.get(value["__dc"])
        if cls is None:
            raise CorruptCheckpointError(f"unknown DCP metadata class {value['__dc']!r}")
        return cls(**{k: _decode(v) for k, v in value["fields"].items()})
    raise CorruptCheckpointError(f"unrecognised tagged value in DCP metadata: {list(value)[:3]}")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def chunk_rows(chunks: list[Any], dims: int) -> np.ndarray | None:
    """``(len(chunks), 2 * dims)`` int64 rows: each chunk's offsets then sizes, flattened in
    the core (about 0.1 µs a chunk; through ``np.fromiter`` 0.6 µs, a list of tuples through
    ``np.array`` 6: at 4,096 ranks x 100 tensors this is the planner's largest step); None
    when a chunk has another rank than ``dims``."""
    if type(chunks) is not list:
        chunks = list(chunks)
    flat = int_attr_rows(chunks, ["offsets", "sizes"], 2 * dims)
    if flat is None:
        return _chunk_rows_py(chunks, dims)
    return (
        np.frombuffer(flat, dtype="<i8").astype(np.int64, copy=False).reshape(len(chunks), 2 * dims)
    )


def _chunk_rows_py(chunks: list[Any], dims: int) -> np.ndarray | None:
    """:func:`chunk_rows` for chunks whose offsets or sizes are not tuples of ints (lists,
    numpy integers): the same rows through ``np.fromiter``."""
    flat = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(map(_OFFSETS_SIZES, chunks))),
        dtype=np.int64,
    )
    if flat.size != 2 * dims * len(chunks):
        return None
    return flat.reshape(len(chunks), 2 * dims)


_OFFSETS_SIZES = operator.attrgetter("offsets", "sizes")


def _fast_tensor(value: Any) -> bool:
    """Whether a ``state_dict_metadata`` value is exactly DCP's tensor metadata, so that its
    chunks can go to the chunk table (exact types: a subclass may carry more fields)."""
    return (
        type(value) is _md.TensorStorageMetadata
        and type(value.properties) is _md.TensorProperties
        and type(value.size) is torch.Size
        and set(map(type, value.chunks)) <= {_md.ChunkStorageMetadata}
    )


#: [state_dict_metadata, (tensors, chunk table), its fast-path keys, its length] of the last
#: encoding (the dict held, so that the identity check cannot match a new object at a reused
#: address): a planner that reuses its cached Metadata (dcp_planners.SavePlanner) makes the
#: next save's encoding O(tensors)
_TABLE_CACHE: list[Any] = [None, None, None, 0]


#: chunk rows the planner flattened while validating (dcp_planners), by the chunk list they
#: came from (held, for an identity check): the encoding of the same save then does not
#: flatten them again. Replaced by every global plan.
_ROWS: dict[int, tuple[list[Any], np.ndarray]] = {}


def remember_rows(rows: dict[int, tuple[list[Any], np.ndarray]]) -> None:
    """Offer the chunk rows of a global plan (``{id(chunks): (chunks, rows)}``) to the next
    encoding of its metadata."""
    _ROWS.clear()
    _ROWS.update(rows)


def rows_of(chunks: Sequence[Any], dims: int) -> np.ndarray | None:
    """:func:`chunk_rows` of ``chunks``: the rows a decoded metadata's chunks are built from
    (:class:`.dcp_lazy.LazyChunks`, no chunk object built or walked), else those of the last
    global plan when they are of this very list and still match it."""
    if isinstance(chunks, LazyChunks):
        rows = chunks.rows
        if rows is not None and rows.shape[1] == 2 * dims:
            return rows
    return _rows_of(list(chunks) if type(chunks) is not list else chunks, dims)


def _rows_of(chunks: list[Any], dims: int) -> np.ndarray | None:
    """:func:`chunk_rows`, from the planner's rows when they are of this very list and still
    match it (same length, same last chunk)."""
    hit = _ROWS.get(id(chunks))
    if hit is not None and hit[0] is chunks and len(hit[1]) == len(chunks) and chunks:
        last = chunks[-1]
        if tuple(hit[1][-1].tolist()) == (*last.offsets, *last.sizes):
            return hit[1]
    return chunk_rows(chunks, dims)


def _chunk_table(sdm: dict[str, Any], fast: set[str]) -> tuple[list[list[Any]], np.ndarray] | None:
    """``([[fqn, properties, size, nchunks], ...], int64 chunk table)`` for the tensors of
    ``sdm`` that are plain DCP tensor metadata; None if a properties value cannot be described
    faithfully. The table holds each chunk's offsets then sizes, tensor after tensor."""
    if _TABLE_CACHE[0] is sdm and _TABLE_CACHE[2] is fast:
        return _TABLE_CACHE[1]
    tensors: list[list[Any]] = []
    rows: list[np.ndarray] = []
    props: dict[int, Any] = {}
    for fqn, value in sdm.items():
        if fqn not in fast:
            continue
        key = id(value.properties)
        if key not in props:
            enc = _encode(value.properties)
            if _decode(enc) != value.properties:
                return None
            props[key] = enc
        dims = len(value.size)
        chunks = value.chunks
        if dims:
            got = _rows_of(chunks, dims)
            if got is None:
                return None  # a chunk of another rank than its tensor
            rows.append(got.reshape(-1))
        tensors.append([fqn, props[key], list(value.size), len(chunks)])
    table = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    _TABLE_CACHE[:] = [sdm, (tensors, table), fast, len(sdm)]
    return tensors, table


def encode_metadata(metadata: _md.Metadata) -> tuple[dict[str, Any], np.ndarray] | None:
    """JSON document and chunk table for ``metadata`` (version 2), or None when it cannot be
    described faithfully.

    The bulk of a large save's metadata is its chunks (ranks × tensors of them): they go to an
    int64 table (entry ``METADATA_CHUNKS_ENTRY``) built in one pass, never through the tagged
    JSON encoder; everything else (other storage metadata, planner data, storage meta) is
    tagged JSON checked by decoding it back and comparing, as in version 1. ``storage_data``
    is not stored: its keys follow from the chunks, and :func:`decode_metadata` derives
    them (:func:`_derived_storage_data`)."""
    try:
        sdm = metadata.state_dict_metadata
        # (the type check walks every chunk: skipped for the cached Metadata of a reused plan)
        same = _TABLE_CACHE[0] is sdm and len(sdm) == _TABLE_CACHE[3]
        fast = _TABLE_CACHE[2] if same else None
        if fast is None:
            fast = {k for k, v in sdm.items() if _fast_tensor(v)}
        built = _chunk_table(sdm, fast)
        if built is None:
            return None
        tensors, table = built
        rest = dataclasses.replace(
            metadata,
            state_dict_metadata={k: v for k, v in sdm.items() if k not in fast},
            storage_data=None,
        )
        document = {
            "format": _MARKER,
            "version": 2,
            "metadata": _encode(rest),
            "tensors": tensors,
        }
        if _decode(document["metadata"]) != rest:
            return None
    except (TypeError, ValueError, CorruptCheckpointError):
        return None
    return document, table


def decode_metadata(document: Any, table: np.ndarray | None = None) -> _md.Metadata:
    """Inverse of :func:`encode_metadata` (``table``: the chunk table of a version 2
    document); reads version 1 documents (storage data stored whole) too.

    A version 2 document decodes in O(tensors): each tensor's ``chunks`` is a
    :class:`.dcp_lazy.LazyChunks` over its rows of the table and ``storage_data`` a
    :class:`.dcp_lazy.DerivedStorageData`, both built only where they are read (a loading
    rank's planner touches about two chunks per tensor; docs/SCALE.md)."""
    if not isinstance(document, dict) or document.get("format") != _MARKER:
        raise CorruptCheckpointError(f"{METADATA_ENTRY} is not shardpoint DCP metadata")
    version = check_version(document)
    if version > 2:
        raise UnsupportedFormatError(
            f"{METADATA_ENTRY}: DCP metadata version {version} was written by a newer "
            "shardpoint (this one reads versions 1 and 2)"
        )
    if "metadata" not in document:
        raise CorruptCheckpointError(f"{METADATA_ENTRY}: no 'metadata' field")
    metadata = _decode_hostile(document["metadata"], "metadata")
    if not isinstance(metadata, _md.Metadata):
        raise CorruptCheckpointError(f"{METADATA_ENTRY} does not hold a DCP Metadata")
    check_decoded(metadata, derived=version == 2)
    if version == 2:
        _add_tensors(metadata, document.get("tensors"), table)
        metadata.storage_data = DerivedStorageData(metadata.state_dict_metadata)
    return metadata


def _decode_hostile(value: Any, field: str) -> Any:
    """:func:`_decode` of a document read from a file: whatever its tagged values hold (a
    wrong arity, a wrong type, nesting deeper than the stack), a CorruptCheckpointError
    naming the field, never the builtin error of the first step that tripped on it."""
    try:
        return _decode(value)
    except CorruptCheckpointError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
        raise CorruptCheckpointError(
            f"{METADATA_ENTRY}: malformed {field} ({type(e).__name__}: {e})"
        ) from None


def _add_tensors(metadata: _md.Metadata, tensors: Any, table: np.ndarray | None) -> None:
    """Rebuild the tensor metadata of a version 2 document over its chunk table (hostile
    input: every count is checked against the table's length before it is used, and every
    chunk against its tensor's bounds, vectorized per tensor, so that no chunk is built)."""
    if not isinstance(tensors, list) or table is None:
        raise CorruptCheckpointError(f"{METADATA_ENTRY}: version 2 without its chunk table")
    flat = np.asarray(table).reshape(-1)
    if flat.dtype != np.int64:
        raise CorruptCheckpointError(f"{METADATA_CHUNKS_ENTRY}: expected int64, got {flat.dtype}")
    if flat.flags.writeable:
        flat = flat.view()
        flat.flags.writeable = False  # the lazy chunks are built from it later
    at = 0
    props_seen: dict[str, Any] = {}
    runs: list[tuple[int, int, list[tuple[str, int, list[int]]]]] = []
    for row in tensors:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)):
            raise CorruptCheckpointError(f"{METADATA_ENTRY}: malformed tensor row")
        fqn, size, n = row[0], row[2], row[3]
        # tensors share few distinct properties: decode each distinct one once
        props_key = repr(row[1])
        props = props_seen.get(props_key)
        if props is None:
            props = _decode_hostile(row[1], f"properties of {fqn!r}")
            check_properties(fqn, props)
            props_seen[props_key] = props
        elif dataclasses.is_dataclass(props):
            # each tensor its own (mutable) properties, as an eager decode gives: a planner or
            # user changing one tensor's must not change every tensor's that shared the text
            props = copy.copy(props)
        if not (
            isinstance(props, _md.TensorProperties)
            and isinstance(size, list)
            and all(type(x) is int and 0 <= x < 2**63 for x in size)
            and type(n) is int
            and n >= 0
        ):
            raise CorruptCheckpointError(f"{METADATA_ENTRY}: malformed tensor row for {fqn!r}")
        if fqn in metadata.state_dict_metadata:
            # a second description would silently replace the first one's chunks
            raise CorruptCheckpointError(f"{METADATA_ENTRY}: tensor {fqn!r} described twice")
        d = len(size)
        if d > MAX_DIMS or (d == 0 and n > 1):
            # a scalar's chunks take no table values: a count from the file would otherwise
            # size the chunk list built when the metadata is iterated
            raise CorruptCheckpointError(
                f"{METADATA_ENTRY}: tensor {fqn!r} of {d} dimensions with {n} chunks"
            )
        end = at + 2 * d * n
        if end > len(flat):
            raise CorruptCheckpointError(
                f"{METADATA_CHUNKS_ENTRY}: {fqn!r} needs chunks past the table's end "
                f"({end} > {len(flat)} values)"
            )
        rows = flat[at:end].reshape(n, 2 * d) if d else np.zeros((n, 0), np.int64)
        if not runs or runs[-1][1] != d:
            runs.append((at, d, []))
        runs[-1][2].append((fqn, n, size))
        at = end
        metadata.state_dict_metadata[fqn] = _md.TensorStorageMetadata(
            properties=props, size=torch.Size(size), chunks=LazyChunks(rows, d)
        )
    if at != len(flat):
        raise CorruptCheckpointError(
            f"{METADATA_CHUNKS_ENTRY}: {len(flat) - at} values after the last tensor's chunks"
        )
    _check_bounds(flat, runs)


def _check_bounds(
    flat: np.ndarray, runs: list[tuple[int, int, list[tuple[str, int, list[int]]]]]
) -> None:
    """Refuse a chunk outside its tensor (a negative offset or size, or past the end along a
    dimension), naming the tensor, the chunk and its place in the table. ``runs``: consecutive
    tensors of one rank ``d`` as ``(start, d, [(fqn, chunks, size), ...])``. A run is checked
    in a few reductions over its rows (its minimum, the chunks' ends, their maximum per tensor
    by ``reduceat``): per tensor, numpy's per-call cost would dominate, and a full elementwise
    comparison makes temporaries as large as the table. Only a failed run is searched for the
    chunk to name."""
    for start, d, tensors in runs:
        count = sum(n for _, n, _ in tensors)
        if not d or not count:
            continue
        rows = flat[start : start + 2 * d * count].reshape(count, 2 * d)
        # offsets and sizes are each below 2**63, so a negative end is an overflow
        ends = rows[:, :d] + rows[:, d:] if int(rows.min()) >= 0 else None
        if ends is not None and int(ends.min()) >= 0:
            firsts = np.cumsum([0] + [n for _, n, _ in tensors[:-1]])
            live = [k for k, (_, n, _) in enumerate(tensors) if n]
            peaks = np.maximum.reduceat(ends, firsts[live], axis=0)
            limits = np.array([tensors[k][2] for k in live], np.int64).reshape(-1, d)
            if not (peaks > limits).any():
                continue
        _name_bad_chunk(rows, start, d, tensors)


def _name_bad_chunk(
    rows: np.ndarray, start: int, d: int, tensors: list[tuple[str, int, list[int]]]
) -> None:
    """Raise for the first chunk of ``rows`` outside its tensor (a run that failed
    :func:`_check_bounds`)."""
    limits = np.repeat(
        np.array([size for _, _, size in tensors], np.int64).reshape(-1, d),
        [n for _, n, _ in tensors],
        axis=0,
    )
    offsets, sizes = rows[:, :d], rows[:, d:]
    bad = np.flatnonzero(((offsets < 0) | (sizes < 0) | (offsets > limits - sizes)).any(axis=1))
    if not len(bad):  # cannot happen: the reductions failed only for a chunk found here
        raise CorruptCheckpointError(f"{METADATA_CHUNKS_ENTRY}: chunks outside their tensors")
    i = int(bad[0])
    for fqn, n, size in tensors:
        if i < n:
            raise CorruptCheckpointError(
                f"{METADATA_CHUNKS_ENTRY}: chunk {i} of {fqn!r} (table value "
                f"{start + 2 * d * i}) is outside the tensor: offsets "
                f"{rows[i, :d].tolist()}, sizes {rows[i, d:].tolist()}, tensor size {size}"
            )
        i -= n
        start += 2 * d * n
