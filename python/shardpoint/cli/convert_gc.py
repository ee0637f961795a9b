"""``shardpoint convert`` (between formats) and ``shardpoint gc`` (stale object-store uploads)."""

from __future__ import annotations

import argparse

from .. import storage
from ..errors import InvalidArgumentError
from .common import EXIT_OK, _emit, _note, human


# --- convert ---------------------------------------------------------------------------------
def cmd_convert(args: argparse.Namespace) -> int:
    from ..convert import convert

    res = convert(
        args.src,
        args.dst,
        to=args.to,
        compression=args.compression,
        level=args.level,
        shards=args.shards,
        overwrite=args.force,
        durable=not args.no_fsync,
        progress=args.progress,
        max_shard_size=args.max_shard_size,
    )
    for n in res.notes:
        _note(n)
    _emit(
        f"converted {res.src_format} -> {res.dst_format}: {res.entries} entries, "
        f"{human(res.raw_bytes)} -> {args.dst}"
    )
    return EXIT_OK


# --- gc --------------------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    if not storage.is_url(args.url):
        raise InvalidArgumentError(f"{args.url}: gc cleans object-store URLs (s3://, gs://, az://)")
    n = storage.gc(args.url, older_than=float(args.older_than))
    _emit(f"aborted {n} incomplete multipart upload(s) under {args.url}")
    return EXIT_OK
