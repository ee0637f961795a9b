"""Signing and verifying checkpoints with the OpenSSF ``model_signing`` library (local keys).

crc32c and the digest manifest catch changed bytes only as long as whoever changed them did not
also fix the checksums; a signature made with a key the attacker does not hold is what does
(docs/RELIABILITY.md). This module signs through ``model_signing``'s public API, so signatures
interoperate with its own CLI (``model_signing sign key`` / ``model_signing verify key``), with
elliptic-curve keys or a signing certificate. No network: sigstore's keyless signing is not used.

What is signed (``model_signing`` signs a *model path*, a file or a directory):

- a shardpoint checkpoint ``P`` (or a manager directory: its latest checkpoint): the directory
  of ``P``, with every entry of it that is not one of ``P``'s files (``P.index`` and the shards
  its index names, ``P/HH/data-…`` for hashed shards, FORMAT.md §3.1.1) recorded as ignored.
  So the signature covers exactly the checkpoint, and the directory may hold other
  checkpoints. (A hashed checkpoint's ``P/`` is a directory, but a path with ``P.index``
  beside it is always the checkpoint, never a directory signed whole.) Default signature file: ``P.sig``. Verification hashes
  the signed files only (``ignore_unsigned_files``), because a manager keeps adding and removing
  other checkpoints beside ``P``, and then checks that ``P.index`` and every shard of the index
  are among the signed files. Their CLI verifies it with
  ``model_signing verify key DIR --signature P.sig --public_key K --ignore_unsigned_files``
  (the flag is only needed once other files have appeared in the directory);
- a Hugging Face model directory, or any other directory: the whole directory, as
  ``model_signing`` does by default, strictly (an added file fails verification). Default
  signature file: ``DIR.sig`` beside the directory.

``model_signing`` (PyPI ``model-signing``, extra ``shardpoint[signing]``) is imported only here.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import storage
from .convert import is_hf_path, resolve_prefix
from .errors import (
    CheckpointError,
    InvalidArgumentError,
    NotFoundError,
    SignatureError,
    SignatureMissingError,
)

__all__ = ["SignedTarget", "sign", "verify_signature", "target_of"]


@dataclass(frozen=True)
class SignedTarget:
    """What a path means to signing: the model path given to ``model_signing``, the files of
    the checkpoint inside it (relative names; empty for a whole directory), the entries to
    ignore, and the default signature file."""

    model_path: Path
    checkpoint_files: tuple[str, ...]
    ignored: tuple[str, ...]
    default_signature: Path

    @property
    def whole_directory(self) -> bool:
        return not self.checkpoint_files


def _checkpoint_files(prefix: str) -> list[str]:
    """``P.index`` and the shard files its index names, as paths relative to P's directory
    (``ck.data-…``, or ``ck/HH/data-…`` for hashed shards)."""
    d = os.path.dirname(os.path.abspath(prefix))
    with storage.open(prefix) as r:
        shards = [os.path.relpath(os.path.abspath(p), d) for p, _ in r.format_info["shards"]]
    return [os.path.basename(prefix) + ".index", *(s.replace(os.sep, "/") for s in shards)]


def _ignored(d: str, own: list[str]) -> list[str]:
    """What in directory ``d`` is not one of ``own``: its other entries, and the other files
    under the directories holding hashed shards (``P/``: a user's own files there)."""
    keep = set(own)
    tops = {n.split("/", 1)[0] for n in own if "/" in n}
    out = [n for n in os.listdir(d) if n not in keep and n not in tops]
    for top in sorted(tops):
        for root, _, files in os.walk(os.path.join(d, top)):
            rels = (os.path.relpath(os.path.join(root, f), d).replace(os.sep, "/") for f in files)
            out += [r for r in rels if r not in keep]
    return sorted(out)


def target_of(
    path: str | os.PathLike[str], signature: str | os.PathLike[str] | None = None
) -> SignedTarget:
    """Resolve what signing ``path`` covers (module docstring)."""
    p = os.fspath(path)
    if storage.is_url(p):
        raise InvalidArgumentError(f"{p}: signing reads local files; download the checkpoint first")
    hashed_prefix = os.path.exists(p.rstrip("/") + ".index")  # `P/` of a hashed checkpoint
    whole = is_hf_path(p) or not os.path.exists(os.path.join(p, "checkpoint"))
    if os.path.isdir(p) and not hashed_prefix and whole:
        d = Path(p)
        inside: tuple[str, ...] = ()
        if signature is not None:
            rel = os.path.relpath(os.path.abspath(signature), os.path.abspath(d))
            inside = () if rel.startswith("..") else (rel,)
        return SignedTarget(d, (), inside, Path(p.rstrip("/") + ".sig"))
    prefix = resolve_prefix(p)
    if not os.path.exists(prefix + ".index"):
        raise NotFoundError(f"{prefix}.index: no checkpoint to sign or verify at {p}")
    d = Path(os.path.dirname(os.path.abspath(prefix)))
    own = _checkpoint_files(prefix)
    sig = Path(signature) if signature is not None else Path(prefix + ".sig")
    ignored = _ignored(str(d), own)
    if sig.resolve().parent == d.resolve() and sig.name not in ignored:
        ignored.append(sig.name)  # written after hashing; never part of what it signs
    return SignedTarget(d, tuple(own), tuple(ignored), Path(prefix + ".sig"))


def _model_signing() -> Any:
    try:
        import model_signing
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise InvalidArgumentError(
            "signing needs the model-signing package: pip install 'shardpoint[signing]'"
        ) from e
    return model_signing


def sign(
    path: str | os.PathLike[str],
    *,
    private_key: str | os.PathLike[str],
    signature: str | os.PathLike[str] | None = None,
    certificate: str | os.PathLike[str] | None = None,
    certificate_chain: Sequence[str | os.PathLike[str]] = (),
    password: str | None = None,
) -> Path:
    """Sign checkpoint (or model directory) ``path`` with a local private key (PEM, elliptic
    curve), or with ``certificate`` (PEM signing certificate of that key) and its
    ``certificate_chain``. Returns the signature file written (default ``P.sig`` /
    ``DIR.sig``); the file is a Sigstore bundle, as ``model_signing sign key`` writes."""
    ms = _model_signing()
    t = target_of(path, signature)
    sig = Path(signature) if signature is not None else t.default_signature
    hashing = ms.hashing.Config().set_ignored_paths(paths=list(t.ignored), ignore_git_paths=True)
    cfg = ms.signing.Config()
    if certificate is None:
        cfg = cfg.use_elliptic_key_signer(private_key=private_key, password=password)
    else:
        cfg = cfg.use_certificate_signer(
            private_key=private_key,
            signing_certificate=certificate,
            certificate_chain=list(certificate_chain),
        )
    try:
        cfg.set_hashing_config(hashing).sign(t.model_path, sig)
    except (OSError, ValueError) as e:
        raise SignatureError(f"{path}: signing failed: {e}") from e
    return sig


def _signed_names(signature: Path) -> set[str]:
    """The resource names a (verified) signature lists: the files it covers."""
    bundle = json.loads(signature.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    return {str(r["name"]) for r in statement["predicate"]["resources"]}


def verify_signature(
    path: str | os.PathLike[str],
    *,
    signature: str | os.PathLike[str] | None = None,
    public_key: str | os.PathLike[str] | None = None,
    certificate_chain: Sequence[str | os.PathLike[str]] | None = None,
) -> list[str]:
    """Check ``path`` against ``signature`` (default ``P.sig`` / ``DIR.sig``) with the public
    key (PEM) or, when ``certificate_chain`` is given, the certificates that issued the signing
    certificate. Returns the signed file names. Raises :class:`SignatureMissingError` when
    there is no signature file, :class:`SignatureError` when a file changed, is missing, or the
    key does not match."""
    if (public_key is None) == (certificate_chain is None):
        raise InvalidArgumentError("give exactly one of public_key and certificate_chain")
    ms = _model_signing()
    t = target_of(path, signature)
    sig = Path(signature) if signature is not None else t.default_signature
    if not sig.is_file():
        raise SignatureMissingError(
            f"{path}: not signed: no signature file {sig} (sign it with `shardpoint sign`)"
        )
    cfg = ms.verifying.Config()
    if public_key is not None:
        cfg = cfg.use_elliptic_key_verifier(public_key=public_key)
    else:
        cfg = cfg.use_certificate_verifier(certificate_chain=list(certificate_chain or ()))
    cfg = cfg.set_ignore_unsigned_files(not t.whole_directory)
    try:
        cfg.verify(t.model_path, sig)
        names = _signed_names(sig)
    except CheckpointError:
        raise
    except Exception as e:  # the library raises ValueError, OSError and crypto errors
        raise SignatureError(f"{path}: signature {sig} does not verify: {e}") from e
    missing = [n for n in t.checkpoint_files if n not in names]
    if missing:
        raise SignatureError(
            f"{path}: signature {sig} does not cover {', '.join(missing)}: it was made for "
            "other files"
        )
    return sorted(names)
