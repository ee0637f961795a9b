"""Strong verification of a checkpoint against the digest manifest recorded at save time.

A save with ``digest="sha256"`` (or ``"blake3"``) hashes every shard file while writing it and
records a manifest (name, length, digest of each shard) in the index metadata (FORMAT.md §7.1).
:func:`verify_strong` re-hashes the shards in the Rust core (parallel, GIL released) and
returns the *root digest*: the digest of the index file, which holds the manifest and so
covers every byte of the checkpoint. Keep the root somewhere an attacker cannot write, or sign
the checkpoint (``shardpoint.signing``): anyone who can rewrite the shards can also rewrite the
manifest in the index (docs/RELIABILITY.md, threat model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import DigestMismatchError, DigestMissingError, InvalidArgumentError

__all__ = ["StrongDigest", "verify_strong", "parse_expected"]


@dataclass(frozen=True)
class StrongDigest:
    """What ``Reader.verify(strong=True)`` checked."""

    #: "sha256" or "blake3"
    algorithm: str
    #: hex digest of the index file: covers the manifest and so every shard
    root: str
    #: shard files re-hashed and their total size in bytes
    files: int
    bytes: int

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.root}"


def parse_expected(expect: str) -> tuple[str | None, str]:
    """``"sha256:<hex>"``, ``"blake3:<hex>"`` or bare hex → (algorithm or None, hex)."""
    algo, _, hexpart = expect.strip().rpartition(":")
    hexpart = hexpart.lower()
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise InvalidArgumentError(
            f"expected root digest {expect!r}: want 64 hex digits, optionally after "
            "'sha256:' or 'blake3:'"
        )
    if algo not in ("", "sha256", "blake3"):
        raise InvalidArgumentError(f"expected root digest {expect!r}: unknown algorithm {algo!r}")
    return (algo or None), hexpart


def verify_strong(core: Any, prefix: str | os.PathLike[str], expect: str | None) -> StrongDigest:
    """Re-hash every shard of the open checkpoint ``core`` (a ``_core.CheckpointReader``)
    against its manifest; compare the root digest with ``expect`` when given."""
    want = None if expect is None else parse_expected(expect)
    if not hasattr(core, "verify_strong"):
        raise InvalidArgumentError(
            f"{prefix}: strong verification reads local files; download the checkpoint first"
        )
    found = core.verify_strong()
    if found is None:
        raise DigestMissingError(
            f"{prefix}.index: no digest manifest: the checkpoint was saved without a strong "
            "digest (save with digest='sha256' or 'blake3'); only its crc32c checksums were checked"
        )
    algorithm, root, nfiles, nbytes, mismatches = found
    if mismatches:
        path, what = mismatches[0]
        more = f" (and {len(mismatches) - 1} more files)" if len(mismatches) > 1 else ""
        raise DigestMismatchError(
            f"{os.fspath(path)}: does not match the {algorithm} digest recorded at save time: "
            f"{what}{more}"
        )
    if want is not None:
        algo, hexpart = want
        if algo is not None and algo != algorithm:
            raise DigestMismatchError(
                f"{prefix}.index: the manifest uses {algorithm}, the expected root is {algo}"
            )
        if hexpart != root:
            raise DigestMismatchError(
                f"{prefix}.index: root digest is {algorithm}:{root}, expected "
                f"{algorithm}:{hexpart} (the index, or a shard through its manifest, changed)"
            )
    return StrongDigest(algorithm, root, int(nfiles), int(nbytes))
