"""``shardpoint verify`` (checksums, strong digests, signatures) and ``shardpoint sign``."""

from __future__ import annotations

import argparse
import os

from .. import storage
from ..errors import InvalidArgumentError
from .common import EXIT_OK, _emit, human


# --- verify ----------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    from ..convert import detect_format, resolve_prefix
    from ..storage.progress import run_with_spinner

    if getattr(args, "signature", None) is None and _verify_trainer_dir(args):
        return EXIT_OK
    fmt, path = detect_format(resolve_prefix(args.path))
    if getattr(args, "signature", None) is not None:
        _verify_signature(args)
    if fmt == "hf":
        return _verify_hf(path, strong=bool(getattr(args, "strong", False)))
    if fmt != "shardpoint":
        raise InvalidArgumentError(f"{path}: is a {fmt} file; verify checks shardpoint checkpoints")
    strong = bool(getattr(args, "strong", False) or getattr(args, "expect", None))
    with storage.open(path) as r:
        fi = r.format_info
        found = run_with_spinner(
            lambda: r.verify(strong=strong, expect=getattr(args, "expect", None)),
            f"verify {os.path.basename(path)}",
            progress=args.progress,
        )
        n = len(r)
    size = fi["index_bytes"] + sum(b for _, b in fi["shards"])
    _emit(f"OK {path}: {n} entries, {len(fi['shards'])} shards, {human(size)} verified")
    if found is not None:
        pinned = " (matches --expect)" if getattr(args, "expect", None) else ""
        _emit(f"strong digest OK: {found.files} shard files re-hashed; root {found}{pinned}")
    return EXIT_OK


def _verify_trainer_dir(args: argparse.Namespace) -> bool:
    """A trainer's checkpoint directory (integrations/verify_dirs.py): its parts and the
    weights files they record. False when ``args.path`` is not one."""
    from ..integrations.verify_dirs import verify_checkpoint_dir

    reports = verify_checkpoint_dir(
        os.fspath(args.path), strong=bool(getattr(args, "strong", False))
    )
    for rep in reports or ():
        weights = f", {rep.weights} weight tensors checked" if rep.weights else ""
        _emit(f"OK {rep.prefix}: {rep.integration}, {rep.entries} entries{weights}")
    return reports is not None


def _verify_signature(args: argparse.Namespace) -> None:
    """``verify --signature``: the signature first (it covers every byte), then the checks."""
    from ..signing import verify_signature

    if (args.public_key is None) == (args.certificate_chain is None):
        raise InvalidArgumentError("--signature needs --public-key or --certificate-chain")
    names = verify_signature(
        args.path,
        signature=args.signature or None,
        public_key=args.public_key,
        certificate_chain=args.certificate_chain,
    )
    _emit(f"signature OK: {len(names)} files signed and unchanged")


def cmd_sign(args: argparse.Namespace) -> int:
    from ..signing import sign

    sig = sign(
        args.path,
        private_key=args.private_key,
        signature=args.signature,
        certificate=args.certificate,
        certificate_chain=args.certificate_chain or (),
        password=os.environ.get(args.password_env) if args.password_env else None,
    )
    _emit(f"signed {args.path}: {sig}")
    return EXIT_OK


def _verify_hf(path: str, strong: bool = False) -> int:
    """A Hugging Face directory has no checksums: check its structure and say so (``strong``:
    it has no digest manifest either, which raises ``DigestMissingError``)."""
    from ..convert.hf import HFReader

    r = HFReader(path)
    with r:
        r.verify(strong=strong)
        n, shards = len(r), len(r.shard_files())
    _emit(
        f"OK {path}: {n} tensors, {shards} shards, structure checked (Hugging Face safetensors "
        "has no checksums; `shardpoint convert` makes a checksummed copy)"
    )
    return EXIT_OK
