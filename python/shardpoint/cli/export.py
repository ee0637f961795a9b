"""``shardpoint export SRC DIR [--tp N]``: a serving directory for vLLM, SGLang and
transformers (:mod:`shardpoint.convert.serving`)."""

from __future__ import annotations

import argparse

from .common import EXIT_OK, _emit, _note, human


def cmd_export(args: argparse.Namespace) -> int:
    """Run ``shardpoint export``; prints one summary line (notes first)."""
    from ..convert.serving import export_serving

    res = export_serving(
        args.src,
        args.dst,
        tp=args.tp,
        compression=args.compression,
        level=args.level,
        overwrite=args.force,
        durable=not args.no_fsync,
        progress=args.progress,
    )
    for n in res.notes:
        _note(n)
    what = f"{args.tp} tensor-parallel ranks" if args.tp else "the whole model"
    _emit(
        f"exported {res.entries} entries ({human(res.raw_bytes)}) for serving, {what} -> {args.dst}"
    )
    return EXIT_OK
