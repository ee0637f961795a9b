"""The reference reader's resolution of delta checkpoints (docs/FORMAT.md §11), written from the
page alone, on top of :mod:`reference_reader` (no ``shardpoint`` import).

- :func:`read_resolved` → ``{key: (dtype, dims, raw bytes)}`` of every user key of a checkpoint,
  the keys of its delta table rebuilt through its base chain; every check of §11 a reader can
  make is made (table fields, the payload layout, the base's index digest and depth, both crcs,
  the all-zero payload of a ``same`` key).

Errors are :class:`reference_reader.FormatError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

import numpy as np

import reference_reader as rr

__all__ = ["read_resolved", "delta_table", "SECTION", "PAYLOAD_PREFIX"]

SECTION = "shardpoint.delta"
RESERVED = "\ufdd0"
PAYLOAD_PREFIX = RESERVED + "delta:"
MAX_DEPTH = 1000
_DIGEST = re.compile(r"^(sha256|state):[0-9a-f]{64}$")

Resolved = dict[str, tuple[str, tuple[int, ...], bytes]]


def delta_table(ck: rr.Checkpoint) -> dict[str, Any] | None:
    """The checkpoint's delta table (§7 ``sections``, §11), checked field by field; ``None``
    for a checkpoint without one."""
    where = ck.prefix + ".index"
    sections = ck.metadata.get("sections")
    if sections is None:
        return None
    if not isinstance(sections, str):
        raise rr.FormatError(where, 0, "metadata 'sections' is not a JSON string")
    parsed = json.loads(sections)
    if not isinstance(parsed, dict) or SECTION not in parsed:
        return None
    t = parsed[SECTION]

    def bad(what: str) -> rr.FormatError:
        return rr.FormatError(where, 0, f"delta table: {what}")

    if not isinstance(t, dict):
        raise bad("not an object")
    if t.get("version") != 1:
        raise bad(f"version {t.get('version')!r}")
    base = t.get("base")
    if not isinstance(base, dict):
        raise bad("base is not an object")
    path, digest = base.get("path"), base.get("digest")
    if path is not None and (not isinstance(path, str) or not path or "\0" in path):
        raise bad(f"base path {path!r}")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise bad(f"base digest {digest!r}")
    depth = t.get("depth")
    if type(depth) is not int or not 1 <= depth <= MAX_DEPTH:
        raise bad(f"depth {depth!r}")
    entries = t.get("entries")
    if not isinstance(entries, dict):
        raise bad("entries is not an object")
    for key, rec in entries.items():
        if not key or "\0" in key or key.startswith(RESERVED):
            raise bad(f"key {key!r}")
        if (
            not isinstance(rec, list)
            or len(rec) != 3
            or rec[0] not in ("same", "xor")
            or not all(type(c) is int and 0 <= c < 2**32 for c in rec[1:])
        ):
            raise bad(f"key {key!r}: record {rec!r}")
    removed = t.get("removed", [])
    if not isinstance(removed, list) or not all(isinstance(k, str) for k in removed):
        raise bad("removed is not a list of keys")
    return t


def _sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_resolved(prefix: str | os.PathLike[str], _seen: int = 0) -> Resolved:
    """``{key: (dtype, dims, raw bytes)}`` of every user key of checkpoint ``prefix`` (a tensor's
    raw bytes are its little-endian elements, §4; other kinds their stored bytes), delta keys
    rebuilt through the base chain (module docstring)."""
    prefix = os.fspath(prefix)
    where = prefix + ".index"
    ck = rr.read_checkpoint(prefix)
    table = delta_table(ck)
    plain = {k: (e.dtype, tuple(e.dims), ck.raw[k]) for k, e in ck.entries.items()}
    reserved = {k for k in plain if k.startswith(RESERVED)}
    if table is None:
        if reserved:
            raise rr.FormatError(where, 0, f"reserved key {sorted(reserved)[0]!r} without a table")
        return plain
    entries = table["entries"]
    if {PAYLOAD_PREFIX + k for k in entries} != reserved:
        raise rr.FormatError(where, 0, "delta payload entries do not match the table's keys")
    both = sorted(set(entries) & set(plain))
    if both:
        raise rr.FormatError(where, 0, f"key {both[0]!r} is stored whole and as a delta")
    if table["base"]["path"] is None:
        raise rr.FormatError(where, 0, "a weight-sync delta has no base checkpoint to read")
    if _seen >= MAX_DEPTH:
        raise rr.FormatError(where, 0, "delta chain longer than 1000")
    bp = os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(prefix)), table["base"]["path"])
    )
    found = "sha256:" + _sha256_file(bp + ".index")
    if found != table["base"]["digest"]:
        raise rr.FormatError(where, 0, f"base {bp}: index digest {found}, recorded "
                             f"{table['base']['digest']}")  # fmt: skip
    base = read_resolved(bp, _seen + 1)
    base_table = delta_table(rr.read_checkpoint(bp))
    if table["depth"] != 1 + (0 if base_table is None else base_table["depth"]):
        raise rr.FormatError(where, 0, f"depth {table['depth']} is not 1 + the base's depth")
    out = {k: v for k, v in plain.items() if k not in reserved}
    for key, (mode, crc, base_crc) in entries.items():
        dtype, dims, payload = plain[PAYLOAD_PREFIX + key]
        if key not in base:
            raise rr.FormatError(where, 0, f"key {key!r}: the base has no value")
        bdtype, bdims, braw = base[key]
        if (bdtype, bdims) != (dtype, dims) or len(braw) != len(payload):
            raise rr.FormatError(where, 0, f"key {key!r}: payload {dtype}{list(dims)} against "
                                 f"base {bdtype}{list(bdims)}")  # fmt: skip
        if rr.crc32c(braw) != base_crc:
            raise rr.ChecksumError(where, 0, f"key {key!r}: base value crc32c")
        if mode == "same":
            if any(payload):
                raise rr.FormatError(where, 0, f"key {key!r}: 'same' payload is not all zero")
            value = braw
        else:
            a = np.frombuffer(braw, np.uint8)
            value = np.bitwise_xor(a, np.frombuffer(payload, np.uint8)).tobytes()
        if rr.crc32c(value) != crc:
            raise rr.ChecksumError(where, 0, f"key {key!r}: rebuilt value crc32c")
        out[key] = (dtype, dims, value)
    return out
