"""``shardpoint stats`` (per-tensor statistics, NaN/Inf check) and ``shardpoint view`` (the page)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import storage
from .common import EXIT_NONFINITE, EXIT_OK, _emit, _num, _shape, _table


# --- stats -----------------------------------------------------------------------------------
def cmd_stats(args: argparse.Namespace) -> int:
    """Per-tensor health; exit 2 when a NaN or Inf is found (unless --no-fail)."""
    from ..convert import resolve_prefix
    from ..inspection import checkpoint_stats, has_nonfinite

    path = args.path if storage.is_url(args.path) else resolve_prefix(args.path)
    stats = checkpoint_stats(path, keys=args.keys, progress=args.progress)
    bad = has_nonfinite(stats)
    if args.json:
        _emit(json.dumps({"checkpoint": path, "tensors": stats, "nonfinite": bad}, indent=1))
    else:
        if stats:
            table = [
                [
                    "KEY",
                    "DTYPE",
                    "SHAPE",
                    "MIN",
                    "MAX",
                    "MEAN",
                    "STD",
                    "L2",
                    "NAN",
                    "INF",
                    "ZEROS",
                    "",
                ]
            ]
            for k, s in stats.items():
                table.append(
                    [
                        k, s["dtype"], _shape(s["shape"]), _num(s["min"]), _num(s["max"]),
                        _num(s["mean"]), _num(s["std"]), _num(s["l2"]), str(s["nan"]),
                        str(s["posinf"] + s["neginf"]), str(s["zeros"]),
                        "NONFINITE" if k in bad else "",
                    ]
                )  # fmt: skip
            _emit(_table(table, right=set(range(3, 11))))
        _emit(f"{len(stats)} tensors, {len(bad)} with NaN/Inf")
    if bad and not args.no_fail:
        if not args.json:
            sys.stderr.write(
                f"shardpoint: {len(bad)} tensor(s) hold NaN/Inf (first: {bad[0]}); exit 2\n"
            )
        return EXIT_NONFINITE
    return EXIT_OK


# --- view ------------------------------------------------------------------------------------
def cmd_view(args: argparse.Namespace) -> int:
    """Write the self-contained HTML page of a checkpoint (and its change against B)."""
    from ..inspection.page import write_page

    out = write_page(
        args.path, args.output, other=args.other, stats=args.stats, progress=args.progress
    )
    _emit(f"wrote {out}")
    if args.open:
        import webbrowser

        webbrowser.open("file://" + os.path.abspath(out))
    return EXIT_OK
