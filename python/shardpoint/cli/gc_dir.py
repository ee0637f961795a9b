"""``shardpoint gc DIR`` on a local directory: delete the checkpoints that are neither kept nor
needed, never a base that a kept checkpoint's delta chain still reads (docs/DELTA.md, CLI.md).

Kept: the checkpoints a ``CheckpointManager`` state file lists and the ``--keep-last N``
newest (by their index file's modification time). Needed: every checkpoint of each kept one's
chain (``shardpoint.delta.needed_bases``). Deleted: the other checkpoints of the directory whose
index is at least ``--older-than`` seconds old (a save still running is spared). When a kept
checkpoint's chain cannot be followed (a damaged or missing link) nothing is deleted: a base
that cannot be proven unneeded stays.
"""

from __future__ import annotations

import argparse
import os
import time

from .. import storage
from ..delta import needed_bases
from ..errors import CheckpointError, InvalidArgumentError
from ..objgraph.checkpoint_state import read_checkpoint_state, resolve
from .common import EXIT_OK, _emit

__all__ = ["gc_directory", "plan_gc"]


def _checkpoints(directory: str) -> dict[str, float]:
    """Absolute prefix -> index mtime of every ``*.index`` checkpoint directly in ``directory``."""
    out = {}
    for f in os.listdir(directory):
        if f.endswith(".index") and os.path.isfile(os.path.join(directory, f)):
            path = os.path.join(directory, f)
            out[os.path.abspath(path[: -len(".index")])] = os.path.getmtime(path)
    return out


def plan_gc(
    directory: str, keep_last: int | None, older_than: float, now: float | None = None
) -> tuple[list[str], list[str], list[str]]:
    """``(kept, needed, delete)``: absolute prefixes of the checkpoints kept, of those kept only
    because a kept one's chain needs them, and of those to delete (module docstring)."""
    if not os.path.isdir(directory):
        raise InvalidArgumentError(f"{directory}: not a directory")
    found = _checkpoints(directory)
    state = read_checkpoint_state(directory)
    if keep_last is None and state is None:
        raise InvalidArgumentError(
            f"{directory}: no checkpoint state file; say which checkpoints to keep with "
            "--keep-last N"
        )
    kept: set[str] = set()
    if state is not None:  # what the manager lists is always kept
        names = state.all_model_checkpoint_paths or [state.model_checkpoint_path]
        kept |= {os.path.abspath(resolve(directory, n)) for n in names}
    if keep_last is not None:
        newest = sorted(found, key=lambda p: (found[p], p), reverse=True)
        kept |= set(newest[: max(0, keep_last)])
    needed: set[str] = set()
    for prefix in sorted(kept):
        if not os.path.exists(prefix + ".index"):
            continue  # listed but gone: nothing of its chain can be read anyway
        try:
            needed.update(needed_bases(prefix))
        except (CheckpointError, OSError) as e:
            raise CheckpointError(
                f"{prefix}: cannot follow its delta chain ({e}); gc deletes nothing while a "
                "kept checkpoint's bases are unknown"
            ) from e
    now = time.time() if now is None else now
    delete = [
        p
        for p in sorted(found)
        if p not in kept and p not in needed and now - found[p] >= older_than
    ]
    return sorted(kept & set(found)), sorted(needed - kept), delete


def gc_directory(args: argparse.Namespace) -> int:
    """``shardpoint gc DIR [--keep-last N] [--older-than S] [--dry-run]``."""
    kept, needed, delete = plan_gc(args.url, args.keep_last, float(args.older_than))
    for p in delete:
        if not args.dry_run:
            storage.remove(p)
    verb = "would delete" if args.dry_run else "deleted"
    _emit(
        f"{verb} {len(delete)} checkpoint(s) under {args.url}; kept {len(kept)}, and "
        f"{len(needed)} more that kept delta checkpoints need as bases"
    )
    for p in delete:
        _emit(f"  {verb}: {os.path.basename(p)}")
    return EXIT_OK
