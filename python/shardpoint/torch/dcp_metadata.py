"""DCP's ``Metadata`` as a shardpoint entry (the codec of :mod:`.dcp`): tagged JSON for the
small parts, an int64 chunk table for the chunks.

Version 1 (still read) was one tagged-JSON document of the whole ``Metadata``, checked by
decoding it back and comparing: about 8 µs per chunk on the coordinator, 30 s for 4,096 ranks ×
100 tensors (docs/SCALE.md). Version 2 puts the chunks (ranks × tensors of them) in the table,
built in one pass and reused while the planner hands back the same cached ``Metadata``; only
the small rest goes through the tagged encoder and its check.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import os
import pathlib
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import metadata as _md

from .._core import int_attr_rows
from ..errors import CorruptCheckpointError

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


#: chunk rows of the last decoded metadata (``decode_metadata``), by chunk list, for the load
#: planner (dcp_load_planner): its lookups then never walk the chunk objects. Replaced by
#: every decode.
_DECODED: dict[int, tuple[list[Any], np.ndarray]] = {}


def rows_of(chunks: list[Any], dims: int) -> np.ndarray | None:
    """:func:`chunk_rows` of ``chunks``, taken from the last decoded metadata or the last
    global plan when they are of this very list and still match it (same length, same last
    chunk): no walk over the chunk objects then."""
    hit = _DECODED.get(id(chunks))
    if hit is not None and hit[0] is chunks and len(hit[1]) == len(chunks) and chunks:
        last = chunks[-1]
        if tuple(hit[1][-1].tolist()) == (*last.offsets, *last.sizes):
            return hit[1]
    return _rows_of(chunks, dims)


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
    document); reads version 1 documents (storage data stored whole) too."""
    if not isinstance(document, dict) or document.get("format") != _MARKER:
        raise CorruptCheckpointError(f"{METADATA_ENTRY} is not shardpoint DCP metadata")
    version = int(document.get("version", 0))
    if version > 2:
        raise CorruptCheckpointError("DCP metadata was written by a newer shardpoint")
    metadata = _decode(document["metadata"])
    if not isinstance(metadata, _md.Metadata):
        raise CorruptCheckpointError(f"{METADATA_ENTRY} does not hold a DCP Metadata")
    if version == 2:
        _add_tensors(metadata, document.get("tensors"), table)
        metadata.storage_data = _derived_storage_data(metadata)
    return metadata


def _derived_storage_data(metadata: _md.Metadata) -> dict[_md.MetadataIndex, str]:
    """The ``storage_data`` a version 2 document does not store: the entry key of every
    stored item, by the rule the writer used (``dcp._storage_key``): a tensor saved whole under
    its name, a shard under ``fqn@o0,o1,...``, a non-tensor item under its name."""
    out: dict[_md.MetadataIndex, str] = {}
    for fqn, value in metadata.state_dict_metadata.items():
        if not isinstance(value, _md.TensorStorageMetadata):
            out[_md.MetadataIndex(fqn)] = fqn
            continue
        chunks = value.chunks
        for c in chunks:
            whole = len(chunks) == 1 and not any(c.offsets) and c.sizes == value.size
            key = fqn if whole else f"{fqn}@{','.join(str(o) for o in c.offsets)}"
            out[_md.MetadataIndex(fqn, c.offsets)] = key
    return out


def _add_tensors(metadata: _md.Metadata, tensors: Any, table: np.ndarray | None) -> None:
    """Rebuild the tensor metadata of a version 2 document from its chunk table (hostile
    input: every count is checked against the table's length before it is used)."""
    if not isinstance(tensors, list) or table is None:
        raise CorruptCheckpointError(f"{METADATA_ENTRY}: version 2 without its chunk table")
    flat = np.asarray(table).reshape(-1)
    if flat.dtype != np.int64:
        raise CorruptCheckpointError(f"{METADATA_CHUNKS_ENTRY}: expected int64, got {flat.dtype}")
    values = flat.tolist()
    at = 0
    _DECODED.clear()
    for row in tensors:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)):
            raise CorruptCheckpointError(f"{METADATA_ENTRY}: malformed tensor row")
        fqn, props, size, n = row[0], _decode(row[1]), row[2], row[3]
        if not (
            isinstance(props, _md.TensorProperties)
            and isinstance(size, list)
            and all(type(x) is int and x >= 0 for x in size)
            and type(n) is int
            and n >= 0
        ):
            raise CorruptCheckpointError(f"{METADATA_ENTRY}: malformed tensor row for {fqn!r}")
        d = len(size)
        end = at + 2 * d * n
        if end > len(values):
            raise CorruptCheckpointError(
                f"{METADATA_CHUNKS_ENTRY}: {fqn!r} needs chunks past the table's end "
                f"({end} > {len(values)} values)"
            )
        chunks = (
            [
                _md.ChunkStorageMetadata(
                    offsets=torch.Size(values[i : i + d]),
                    sizes=torch.Size(values[i + d : i + 2 * d]),
                )
                for i in range(at, end, 2 * d)
            ]
            if d
            else [_md.ChunkStorageMetadata(torch.Size(), torch.Size()) for _ in range(n)]
        )
        if d:
            _DECODED[id(chunks)] = (chunks, flat[at:end].reshape(n, 2 * d))
        at = end
        metadata.state_dict_metadata[fqn] = _md.TensorStorageMetadata(
            properties=props, size=torch.Size(size), chunks=chunks
        )
    if at != len(values):
        raise CorruptCheckpointError(
            f"{METADATA_CHUNKS_ENTRY}: {len(values) - at} values after the last tensor's chunks"
        )
