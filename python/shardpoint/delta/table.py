"""The delta table: the ``"shardpoint.delta"`` metadata section of a delta checkpoint
(docs/FORMAT.md §11), built by writers and checked field by field by readers (the text comes
from disk or a network: hostile until checked)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptCheckpointError, UnsupportedFormatError
from ..storage.values import RESERVED_KEY_PREFIX

__all__ = [
    "SECTION",
    "VERSION",
    "MAX_DEPTH",
    "MODES",
    "PAYLOAD_PREFIX",
    "payload_key",
    "has_payload_key",
    "DeltaEntry",
    "DeltaTable",
    "parse",
]

#: the metadata section's name (FORMAT.md §7: sections are keyed by layer)
SECTION = "shardpoint.delta"
#: the table's version; readers refuse another
VERSION = 1
#: the longest chain a reader follows (writers cap chains far lower: ``max_chain``)
MAX_DEPTH = 1000
#: how an entry is stored: ``same`` (its payload is all zero, the value is the base's),
#: ``xor`` (its payload is the XOR of its bits with the base's value of the same key)
MODES = ("same", "xor")

#: the stored key of a delta entry's payload is this + the user's key: under the library's
#: reserved prefix (FORMAT.md §11), so a reader that does not know delta tables finds nothing
#: under the user's key (a missing key, never the XOR payload as if it were the value)
PAYLOAD_PREFIX = RESERVED_KEY_PREFIX + "delta:"
_MAX_KEY = 65535


def payload_key(key: str) -> str:
    """The stored key of ``key``'s delta payload."""
    return PAYLOAD_PREFIX + key


def has_payload_key(key: str) -> bool:
    """Whether ``key``'s payload key fits the format's key length (else it is stored whole)."""
    return len(key.encode("utf-8")) + len(PAYLOAD_PREFIX.encode("utf-8")) <= _MAX_KEY


_DIGEST = re.compile(r"^(sha256|state):[0-9a-f]{64}$")
_U32 = 1 << 32


@dataclass(frozen=True)
class DeltaEntry:
    """How one key is stored against the base."""

    mode: str
    #: crc32c of the reconstructed value's bytes
    crc: int
    #: crc32c of the base value's bytes the payload was made against
    base_crc: int


@dataclass
class DeltaTable:
    """The section: which base, how deep the chain is, and each delta key's mode and crcs.
    Keys absent from ``entries`` are stored whole (ordinary entries)."""

    #: the base: a checkpoint prefix (relative to this checkpoint's directory, or absolute);
    #: ``None`` for a weight-sync delta, whose base is the receiver's state
    base_path: str | None
    #: ``sha256:<hex>`` of the base's index file, or ``state:<hex>`` (:func:`state_digest`)
    base_digest: str
    #: 1 + the base's depth (a full checkpoint has depth 0)
    depth: int
    entries: dict[str, DeltaEntry] = field(default_factory=dict)
    #: keys of the base that the new state no longer has (weight sync)
    removed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The section as stored."""
        return {
            "version": VERSION,
            "base": {"path": self.base_path, "digest": self.base_digest},
            "depth": self.depth,
            "entries": {k: [e.mode, e.crc, e.base_crc] for k, e in sorted(self.entries.items())},
            "removed": sorted(self.removed),
        }


def _bad(where: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{where}: delta table ({SECTION!r} section): {what}")


def _u32(v: Any, where: str, what: str) -> int:
    if type(v) is not int or not 0 <= v < _U32:
        raise _bad(where, f"{what} must be a u32 crc32c, got {v!r}")
    return v


def parse(section: Any, where: str) -> DeltaTable:
    """Check and parse a section read from ``where`` (a file name, for errors)."""
    if not isinstance(section, dict):
        raise _bad(where, f"must be an object, got {type(section).__name__}")
    version = section.get("version")
    if version != VERSION:
        raise UnsupportedFormatError(
            f"{where}: delta table version {version!r}; this reader reads version {VERSION}"
        )
    base = section.get("base")
    if not isinstance(base, dict):
        raise _bad(where, "'base' must be an object")
    path, digest = base.get("path"), base.get("digest")
    if path is not None and (not isinstance(path, str) or not path or "\x00" in path):
        raise _bad(where, f"base path must be a non-empty string or null, got {path!r}")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise _bad(
            where, f"base digest must be 'sha256:<64 hex>' or 'state:<64 hex>', got {digest!r}"
        )
    depth = section.get("depth")
    if type(depth) is not int or not 1 <= depth <= MAX_DEPTH:
        raise _bad(where, f"depth must be an int in 1..{MAX_DEPTH}, got {depth!r}")
    raw = section.get("entries")
    if not isinstance(raw, dict):
        raise _bad(where, "'entries' must be an object")
    entries = {}
    for key, rec in raw.items():
        if (
            not key
            or "\x00" in key
            or key.startswith(RESERVED_KEY_PREFIX)
            or not has_payload_key(key)
        ):
            raise _bad(where, f"key {key[:80]!r} cannot be a delta key")
        if not isinstance(rec, list) or len(rec) != 3 or rec[0] not in MODES:
            raise _bad(where, f"key {key!r}: want [mode, crc, base_crc] with mode in {MODES}")
        entries[key] = DeltaEntry(
            rec[0],
            _u32(rec[1], where, f"key {key!r} crc"),
            _u32(rec[2], where, f"key {key!r} base crc"),
        )
    removed = section.get("removed", [])
    if not isinstance(removed, list) or not all(isinstance(k, str) for k in removed):
        raise _bad(where, "'removed' must be a list of keys")
    return DeltaTable(path, digest, depth, entries, list(removed))
