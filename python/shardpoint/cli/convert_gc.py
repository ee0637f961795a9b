"""``shardpoint convert`` (between formats) and ``shardpoint gc`` (leftovers of dead saves under
a URL or directory; with ``--keep-last``, unneeded checkpoints of a directory: cli/gc_dir.py)."""

from __future__ import annotations

import argparse

from .. import storage
from ..errors import InvalidArgumentError
from .common import EXIT_OK, _emit, _note, human


# --- convert ---------------------------------------------------------------------------------
def cmd_convert(args: argparse.Namespace) -> int:
    if args.base is not None:
        return _convert_delta(args)
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


def _convert_delta(args: argparse.Namespace) -> int:
    """``convert SRC DST --base BASE``: SRC's values (any format ``open`` reads, held in memory)
    saved as a delta checkpoint against BASE."""
    if args.to not in (None, "shardpoint"):
        raise InvalidArgumentError("--base writes a shardpoint (delta) checkpoint: not with --to")
    if storage.exists(args.dst) and not args.force:
        raise InvalidArgumentError(f"{args.dst}: exists (--force replaces it)")
    with storage.open(args.src) as r:
        values = r.load()
        sections = _kept_sections(r)
    storage.save_file(values, args.dst, base=args.base, delta=True,
                      compression=args.compression, level=args.level,
                      durable=not args.no_fsync, _sections=sections)  # fmt: skip
    from ..delta import describe

    d = describe(args.dst)
    tensors = d.get("tensors", {})
    modes = [t["mode"] for t in tensors.values()]
    stored = sum(t["stored_bytes"] for t in tensors.values())
    raw = sum(t["raw_bytes"] for t in tensors.values())
    _emit(
        f"converted {args.src} -> {args.dst} against {args.base}: {len(values)} entries "
        f"({modes.count('same')} same, {modes.count('xor')} xor, {modes.count('full')} whole), "
        f"{human(raw)} raw -> {human(stored)} stored"
    )
    return EXIT_OK


def _kept_sections(r: object) -> dict[str, object] | None:
    """The non-weight files of SRC (config.json, tokenizer...) as the checkpoint keeps them
    (convert/hf_files.py), so that ``convert DST OUT --to hf`` writes them back beside the
    weights: an HF directory's own files, or a shardpoint source's kept-files section."""
    from ..convert.hf_files import SECTION, collect_files

    directory = getattr(r, "directory", None)
    if isinstance(directory, str) and hasattr(r, "index_path"):  # an HF directory
        notes: list[str] = []
        kept = collect_files(directory, notes)
        for n in notes:
            _note(n)
        return None if kept is None else {SECTION: kept}
    own = getattr(r, "sections", {})
    return {SECTION: own[SECTION]} if isinstance(own, dict) and SECTION in own else None


# --- gc --------------------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    keep_last = getattr(args, "keep_last", None)
    if keep_last is not None:
        if storage.is_url(args.url):
            raise InvalidArgumentError(f"{args.url}: --keep-last is for local directories")
        from .gc_dir import gc_directory

        code = gc_directory(args)  # whole checkpoints neither kept nor needed as a base
        if args.dry_run:
            return code
    elif getattr(args, "dry_run", False):
        raise InvalidArgumentError("--dry-run lists what --keep-last N would delete: give it")
    n = storage.gc(args.url, older_than=float(args.older_than))
    _emit(f"removed {n} leftover(s) of saves that never committed under {args.url}")
    return EXIT_OK
