"""Parsing and validating Hugging Face safetensors shards and ``*.safetensors.index.json`` files.

Bytes from disk are hostile. The checks are the ones the ``safetensors`` library makes before it
hands out a tensor (its ``SafeTensors::read_metadata``), so a file the library refuses is refused
here too, with a :class:`CorruptCheckpointError` naming the file (and the key, when one is at
fault) instead of a crash:

- the file holds at least the 8-byte little-endian header length; the header is at most 100 MB
  and fits in the file; it is UTF-8 JSON starting with ``{``, an object, with no duplicate key;
- ``__metadata__``, when present, maps str to str;
- every tensor names a known dtype, a shape of non-negative ints that numpy can represent (no
  dimension, and no byte size of the non-zero dimensions, above ``2^63 - 1``: a stricter check
  than the library's, which accepts ``[0, 2^64 - 1]``), and ``data_offsets``
  ``[begin, end]`` with ``begin <= end``; ``end - begin`` equals the shape's element count times
  the dtype size;
- sorted by offset, the tensors tile the data area exactly: the first begins at 0, each begins
  where the previous ended (no hole, no overlap), the last ends at the end of the file.

A header that passes every check is parsed and checked by compiled code
(``rust/src/st_header.rs``, 2.5-3x faster for a file of many tensors); any other falls
through to the checks here, which name the fault.

The index JSON is checked the way ``huggingface_hub`` checks it: an object whose ``weight_map``
maps str keys to relative ``.safetensors`` file names without ``..`` (no path escapes the
directory).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import PureWindowsPath
from typing import Any

from ..errors import CorruptCheckpointError, NotFoundError
from ..storage.collector import collector_paused
from ..storage.dtypes import shape_problem
from ..storage.safetensors_header import parse_safetensors_header

__all__ = [
    "ST_BITS",
    "MAX_HEADER",
    "MAX_INDEX_BYTES",
    "TensorRecord",
    "ShardHeader",
    "read_shard_header",
    "read_index",
]

#: Bits per element of every dtype tag the safetensors format defines.
ST_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
MAX_HEADER = 100_000_000  # the safetensors library's own cap on the JSON header
MAX_INDEX_BYTES = 256 << 20  # an index JSON larger than this is not a real index


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """One tensor of a shard header: dtype tag, shape, and its byte range in the data area.
    Slotted: one object per tensor for Python's collector, not two (a header may list
    20,000)."""

    tag: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class ShardHeader:
    """A validated shard header: tensors by name, where data starts, the file size."""

    path: str
    tensors: dict[str, TensorRecord]
    metadata: dict[str, str]
    data_start: int
    file_size: int


def _corrupt(path: str, what: str, key: str | None = None) -> CorruptCheckpointError:
    where = f"{path}: key {key!r}: " if key is not None else f"{path}: "
    return CorruptCheckpointError(f"{where}{what}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _record(path: str, key: str, raw: object, data_len: int) -> TensorRecord:
    if not isinstance(raw, dict):
        raise _corrupt(path, "header entry is not an object", key)
    tag = raw.get("dtype")
    shape = raw.get("shape")
    offs = raw.get("data_offsets")
    if not isinstance(tag, str) or tag not in ST_BITS:
        raise _corrupt(path, f"unknown safetensors dtype {tag!r}", key)
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _corrupt(path, f"shape {shape!r} is not a list of non-negative ints", key)
    problem = shape_problem(shape, ST_BITS[tag])
    if problem is not None:
        raise _corrupt(path, f"shape {shape} of {tag} cannot be represented: {problem}", key)
    if (
        not isinstance(offs, list)
        or len(offs) != 2
        or not all(_is_int(o) and o >= 0 for o in offs)
        or offs[0] > offs[1]
    ):
        raise _corrupt(path, f"data_offsets {offs!r} are not [begin, end] with begin <= end", key)
    begin, end = offs
    if end > data_len:
        raise _corrupt(
            path, f"data_offsets [{begin}, {end}] run past the data area ({data_len} bytes)", key
        )
    bits = ST_BITS[tag]
    n = 0 if 0 in shape else 1
    for d in shape if n else ():  # capped as it grows: a hostile shape cannot build a huge number
        n *= d
        if n * bits > data_len * 8:
            break
    if n * bits % 8 or n * bits // 8 != end - begin:
        raise _corrupt(
            path,
            f"{tag}{shape} needs {n * bits / 8:g} bytes but data_offsets [{begin}, {end}] "
            f"hold {end - begin}",
            key,
        )
    return TensorRecord(tag, tuple(shape), begin, end)


def read_shard_header(path: str) -> ShardHeader:
    """Read and validate the header of safetensors file ``path`` (the data is not read)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _corrupt(path, "not a regular file")
            size = st.st_size
            head = f.read(8)
            if len(head) < 8:
                raise _corrupt(path, f"file is {size} bytes, too short for a safetensors header")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER:
                raise _corrupt(path, f"header length {n} exceeds the {MAX_HEADER}-byte limit")
            if 8 + n > size:
                raise _corrupt(path, f"header length {n} runs past the end of the file ({size})")
            blob = f.read(n)
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    if len(blob) != n:
        raise _corrupt(path, "file shrank while its header was read")
    if not blob.startswith(b"{"):
        raise _corrupt(path, "header does not start with '{'")
    # a record (and a shape) per tensor, all kept: the collector paused (storage/collector.py)
    with collector_paused():
        fast = parse_safetensors_header(blob, size - 8 - n)
        if fast is not None:  # every check of _checked_header passed, in compiled code
            entries, meta_fast = fast
            records = {k: TensorRecord(tag, shape, b, e) for k, tag, shape, b, e in entries}
            return ShardHeader(path, records, meta_fast, 8 + n, size)
    return _checked_header(path, blob, size)


def _checked_header(path: str, blob: bytes, size: int) -> ShardHeader:
    """The header JSON ``blob`` of safetensors file ``path`` (``size`` bytes), checked here:
    the reference the compiled fast path must agree with, and what names a fault."""
    n = len(blob)
    try:
        header = json.loads(blob.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _corrupt(path, f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise _corrupt(path, "__metadata__ is not a mapping of str to str")
    data_len = size - 8 - n
    tensors = {k: _record(path, k, v, data_len) for k, v in header.items()}
    # The tensors must tile the data area: sorted by offset, each starts where the last ended.
    pos, prev = 0, None
    for key, rec in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if rec.begin != pos:
            what = "overlaps" if rec.begin < pos else "leaves a hole after"
            raise _corrupt(
                path,
                f"data_offsets [{rec.begin}, {rec.end}] {what} "
                f"{'the start of the data' if prev is None else repr(prev)} (expected {pos})",
                key,
            )
        pos, prev = rec.end, key
    if pos != data_len:
        raise _corrupt(
            path, f"tensors cover {pos} bytes of a {data_len}-byte data area (trailing bytes)"
        )
    return ShardHeader(path, tensors, dict(meta), 8 + n, size)


def read_index(path: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``(weight_map, metadata)`` of a ``*.safetensors.index.json`` file, validated."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_INDEX_BYTES:
                raise _corrupt(path, f"index is {size} bytes (limit {MAX_INDEX_BYTES})")
            blob = f.read()
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    try:
        doc = json.loads(blob.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _corrupt(path, f"index is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise _corrupt(path, "expected a JSON object with a 'weight_map' object")
    meta = doc.get("metadata", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise _corrupt(path, "'metadata' is not an object")
    weight_map: dict[str, str] = doc["weight_map"]
    checked: set[str] = set()  # thousands of keys share a few file names: check each name once
    for key, fname in weight_map.items():
        if fname in checked:
            continue
        if not isinstance(fname, str):
            raise _corrupt(path, f"weight_map value {fname!r} is not a file name", key)
        win = PureWindowsPath(fname)
        if win.drive or win.root or ".." in win.parts or not fname.endswith(".safetensors"):
            raise _corrupt(
                path,
                f"weight_map names {fname!r}: shard names must be relative .safetensors paths "
                "without '..'",
                key,
            )
        checked.add(fname)
    return weight_map, meta
