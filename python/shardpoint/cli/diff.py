"""``shardpoint diff``: two checkpoints compared key by key, or value by value (``--values``)."""

from __future__ import annotations

import argparse
import json

from ..errors import InvalidArgumentError
from .common import EXIT_DAMAGED, EXIT_OK, _emit, _num, _shape, _table


# --- diff ------------------------------------------------------------------------------------
def cmd_diff(args: argparse.Namespace) -> int:
    from ..convert import open_source
    from ..convert.compare import diff_sources

    if args.atol < 0:
        raise InvalidArgumentError(f"--atol must be >= 0, got {args.atol}")
    if args.values:
        return _diff_values(args)
    with open_source(args.a) as a, open_source(args.b) as b:
        res = diff_sources(a, b, atol=args.atol, progress=args.progress)
    if args.json:
        doc = {
            "identical": res.identical,
            "only_a": res.only_a,
            "only_b": res.only_b,
            "differences": [d.__dict__ for d in res.differences],
            "equal": res.equal,
        }
        _emit(json.dumps(doc, indent=1, default=str))
    else:
        for k in res.only_a:
            _emit(f"only in A:  {k}")
        for k in res.only_b:
            _emit(f"only in B:  {k}")
        for d in res.differences:
            if d.what == "value" and d.max_abs is not None:
                _emit(f"values differ:  {d.key}  max |a-b| = {d.max_abs:.6g}")
            elif d.what == "value":
                _emit(f"values differ:  {d.key}  {d.a} != {d.b}")
            else:
                _emit(f"{d.what} differs:  {d.key}  {d.a} vs {d.b}")
        _emit(
            f"{len(res.equal) + len(res.differences)} common keys: {len(res.equal)} equal, "
            f"{len(res.differences)} differ; {len(res.only_a)} only in A, {len(res.only_b)} only in B"
        )
    return EXIT_OK if res.identical else EXIT_DAMAGED


def _diff_values(args: argparse.Namespace) -> int:
    """``diff --values``: how far every common tensor moved, largest relative change first."""
    from ..inspection import value_diff

    res = value_diff(args.a, args.b, keys=args.keys, progress=args.progress)
    if args.json:
        doc = {
            "identical": res.identical,
            "only_a": res.only_a,
            "only_b": res.only_b,
            "mismatched": [dict(zip(("key", "what", "a", "b"), m, strict=True)) for m in res.mismatched],
            "other_changed": res.other_changed,
            "tensors": [t.as_json() for t in res.tensors],
        }  # fmt: skip
        _emit(json.dumps(doc, indent=1))
        return EXIT_OK if res.identical else EXIT_DAMAGED
    for k in res.only_a:
        _emit(f"only in A:  {k}")
    for k in res.only_b:
        _emit(f"only in B:  {k}")
    for k, what, a, b in res.mismatched:
        _emit(f"{what} differs:  {k}  {a} vs {b}")
    for k in res.other_changed:
        _emit(f"value differs:  {k}")
    if res.tensors:
        table = [["KEY", "DTYPE", "SHAPE", "REL L2", "MAX |A-B|", "CHANGED", "SAME"]]
        for t in res.tensors:
            same = ("yes (crc)" if t.decided_by == "crc" else "yes") if t.identical else "no"
            changed = "-" if t.count < 0 else f"{t.changed}/{t.count}"
            table.append(
                [t.key, t.dtype, _shape(t.shape), _num(t.rel_l2), _num(t.max_abs), changed, same]
            )
        _emit(_table(table, right={3, 4, 5}))
    moved = sum(1 for t in res.tensors if not t.identical)
    by_crc = sum(1 for t in res.tensors if t.decided_by == "crc")
    _emit(
        f"{len(res.tensors)} common tensors: {moved} changed, {len(res.tensors) - moved} identical "
        f"({by_crc} by equal crc32c, not read); {len(res.only_a)} only in A, "
        f"{len(res.only_b)} only in B, {len(res.mismatched)} dtype/shape/kind changes"
    )
    return EXIT_OK if res.identical else EXIT_DAMAGED
