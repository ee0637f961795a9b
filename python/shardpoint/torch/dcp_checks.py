"""Checks of a decoded DCP metadata document (:mod:`.dcp_metadata`): the document is read from
a checkpoint, so it is hostile input. The tagged decoder builds DCP's dataclasses from whatever
the JSON says; here what it built is checked to be what a StorageWriter writes (the mapping
types, the tensor properties, every eagerly decoded chunk inside its tensor), so that a damaged
or crafted document is refused at ``read_metadata`` with its entry and field named, instead of
failing later, deep inside a planner, or loading the wrong bytes.

The chunks of a version 2 document's table are checked where they are read
(``dcp_metadata._check_bounds``, vectorized); this module checks what the tagged JSON carries:
all of a version 1 document, the non-tensor rest of a version 2 one.
"""

from __future__ import annotations

import reprlib
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as _md

from ..errors import CorruptCheckpointError

__all__ = ["check_version", "check_properties", "check_decoded", "check_table_entry"]

_ENTRY = ".dcp_metadata"
#: a DCP tensor has at most this many dimensions here (torch's own limit is 64); a larger
#: count in a file is damage, refused before anything is sized by it
MAX_DIMS = 64


def check_table_entry(prefix: str, info: Any, entries: int) -> None:
    """Refuse the chunk table's index record before the table is read: a 1-d int64 tensor of
    at most ``2 * MAX_DIMS`` values per entry of the checkpoint (each chunk is stored as an
    entry of its own, and holds its offsets and sizes). The record's shape comes from the
    file: without this cap a compressed table (zeros compress a thousandfold) could declare
    gigabytes and be decompressed whole before the document says how many values it needs."""
    n = 1
    for d in info.shape:
        n *= d
    cap = 2 * MAX_DIMS * entries
    if info.kind != "tensor" or info.dtype != "int64" or len(info.shape) != 1 or n > cap:
        raise CorruptCheckpointError(
            f"{prefix}: {info.key}: {info.kind} {info.dtype}{list(info.shape)}; the chunk "
            f"table is a 1-d int64 tensor of at most {cap} values in a checkpoint of "
            f"{entries} entries"
        )


def check_version(document: dict[str, Any]) -> int:
    """The document's format version: a non-negative int (missing: 0, the first documents)."""
    version = document.get("version", 0)
    if type(version) is not int or version < 0:
        raise CorruptCheckpointError(f"{_ENTRY}: version {version!r} is not a metadata version")
    return version


def check_properties(fqn: str, props: Any) -> None:
    """Refuse tensor properties a StorageWriter cannot have written (a dtype that is not a
    torch dtype would otherwise reach the planner's ``torch.empty``)."""
    if not isinstance(props, _md.TensorProperties):
        raise CorruptCheckpointError(f"{_ENTRY}: tensor {fqn!r} has no TensorProperties")
    for field, kind in (
        ("dtype", torch.dtype),
        ("layout", torch.layout),
        ("memory_format", torch.memory_format),
    ):
        if not isinstance(getattr(props, field, None), kind):
            raise CorruptCheckpointError(
                f"{_ENTRY}: tensor {fqn!r}: {field} {getattr(props, field, None)!r} is not a "
                f"torch.{kind.__name__}"
            )


def _check_size(fqn: str, what: str, size: Any) -> tuple[int, ...]:
    # (a list too: a custom planner's sizes that are not torch.Size travel as JSON lists)
    if not (
        isinstance(size, tuple | list)
        and len(size) <= MAX_DIMS
        and all(type(x) is int and 0 <= x < 2**63 for x in size)
    ):
        raise CorruptCheckpointError(
            f"{_ENTRY}: tensor {fqn!r}: {what} {reprlib.repr(size)} is malformed"
        )
    return tuple(size)


def _check_tensor(fqn: str, md: _md.TensorStorageMetadata) -> None:
    """One eagerly decoded tensor: properties, size, and every chunk inside the tensor."""
    check_properties(fqn, md.properties)
    size = _check_size(fqn, "size", md.size)
    if not isinstance(md.chunks, list):
        raise CorruptCheckpointError(f"{_ENTRY}: tensor {fqn!r}: chunks are not a list")
    if not size and len(md.chunks) > 1:
        raise CorruptCheckpointError(
            f"{_ENTRY}: scalar tensor {fqn!r} has {len(md.chunks)} chunks (at most 1)"
        )
    for i, chunk in enumerate(md.chunks):
        if not isinstance(chunk, _md.ChunkStorageMetadata):
            raise CorruptCheckpointError(f"{_ENTRY}: chunk {i} of {fqn!r} is not a chunk")
        offsets = _check_size(fqn, f"chunk {i} offsets", chunk.offsets)
        sizes = _check_size(fqn, f"chunk {i} sizes", chunk.sizes)
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise CorruptCheckpointError(
                f"{_ENTRY}: chunk {i} of {fqn!r} has {len(offsets)}/{len(sizes)} dimensions, "
                f"the tensor {len(size)}"
            )
        if any(o + s > n for o, s, n in zip(offsets, sizes, size, strict=True)):
            raise CorruptCheckpointError(
                f"{_ENTRY}: chunk {i} of {fqn!r} is outside the tensor: offsets "
                f"{list(offsets)}, sizes {list(sizes)}, tensor size {list(size)}"
            )


def check_decoded(metadata: _md.Metadata, *, derived: bool) -> None:
    """Refuse a decoded ``Metadata`` that a StorageWriter cannot have written: a
    ``state_dict_metadata`` that is not a ``{str: tensor or bytes metadata}`` dict, a tensor
    whose properties, size or chunks are malformed, and (``derived`` False: version 1, stored
    whole) a ``storage_data`` that is not a ``{MetadataIndex: str}`` dict."""
    sdm = metadata.state_dict_metadata
    if not isinstance(sdm, dict):
        raise CorruptCheckpointError(f"{_ENTRY}: state_dict_metadata is not a dict")
    for fqn, md in sdm.items():
        if not isinstance(fqn, str):
            raise CorruptCheckpointError(f"{_ENTRY}: state_dict_metadata key {fqn!r} is not a str")
        if isinstance(md, _md.TensorStorageMetadata):
            _check_tensor(fqn, md)
        elif not isinstance(md, _md.BytesStorageMetadata):
            raise CorruptCheckpointError(
                f"{_ENTRY}: {fqn!r} is described by a {type(md).__name__}, not tensor or bytes "
                "metadata"
            )
    if derived:
        return
    data = metadata.storage_data
    if not isinstance(data, dict) or not all(
        isinstance(k, _md.MetadataIndex) and isinstance(v, str) for k, v in data.items()
    ):
        raise CorruptCheckpointError(
            f"{_ENTRY}: storage_data is not a mapping of MetadataIndex to entry keys"
        )
