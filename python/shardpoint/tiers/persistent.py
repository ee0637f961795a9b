"""The persistent tier: each rank uploads its part from the local copy, rank 0 commits.

Run on the persistent tier's own background thread and group (group.py), so an upload never
stalls training or the next local save. One step's upload:

1. rank 0 removes the commit record of an earlier save of the same step number (a restarted
   job saving that number again), and every rank waits for that (one all-gather), so a part
   of the new save never sits beside the old save's record;
2. each rank reads its part from the local tier, checks every file against the crc32c of the
   local commit record, and writes it to ``<directory>/ckpt-<step>/part-RRRRR`` (shards first,
   the index last);
3. the ranks all-gather their outcome and file lists; if every rank succeeded, rank 0 writes
   ``<directory>/ckpt-<step>/tier-commit.json`` (the step's commit: token, world size, every
   part's file crcs) and then applies retention (records first, then the parts).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .. import storage
from ..errors import CheckpointError, TierError
from ..objgraph.storage_io import delete_name
from .faults import fault_point
from .group import Collective
from .layout import (
    PERSISTENT_RECORD,
    persistent_part,
    persistent_step_dir,
    persistent_steps,
    read_record,
    write_record,
)
from .parts import Part, join, read_part, write_part

__all__ = ["upload_step", "apply_retention"]

logger = logging.getLogger("shardpoint")


def upload_step(
    group: Collective, directory: str, local_prefix: str, step: int, token: str, files: list[Any]
) -> int:
    """Upload this rank's part of ``step`` and commit the step (a collective); returns the step."""
    rank = group.rank
    record_path = join(persistent_step_dir(directory, step), PERSISTENT_RECORD)
    if rank == 0:
        old = read_record(record_path)
        if old is not None and str(old["token"]) != token:
            delete_name(record_path)
    group.all_gather(None)  # nobody uploads before an older record of this step is gone
    error = None
    try:
        part = read_part(local_prefix, rank, step, token, expect=files)
        write_part(
            part,
            persistent_part(directory, step, rank),
            after_data=lambda: fault_point("persistent:after-data", rank, step),
        )
        fault_point("persistent:after-part", rank, step)
    except (CheckpointError, OSError, ValueError) as e:
        error = f"rank {rank}: {type(e).__name__}: {e}"
    outcomes = group.all_gather([error, files])
    failed = [o[0] for o in outcomes if o[0] is not None]
    if failed:
        raise TierError(
            f"{persistent_step_dir(directory, step)}: persistent upload of step {step} failed, "
            "the step is not committed there: " + "; ".join(failed)
        )
    if rank == 0:
        fault_point("persistent:before-commit", rank, step)
        write_record(
            record_path,
            {
                "format": 1,
                "step": step,
                "token": token,
                "world": group.world_size,
                "parts": {str(r): o[1] for r, o in enumerate(outcomes)},
            },
        )
    return step


def apply_retention(directory: str, world: int, max_to_keep: int | None) -> None:
    """Keep the newest ``max_to_keep`` committed steps of the persistent tier (rank 0 only):
    each older one loses its record first, then its parts."""
    if max_to_keep is None:
        return
    for rec in persistent_steps(directory)[max_to_keep:]:
        step = int(rec["step"])
        step_dir = persistent_step_dir(directory, step)
        try:
            path = join(step_dir, PERSISTENT_RECORD)
            delete_name(path)
            for owner in range(int(rec.get("world", world))):
                prefix = persistent_part(directory, step, owner)
                if storage.exists(prefix):
                    storage.remove(prefix)
            if not storage.is_url(step_dir):
                try:
                    os.rmdir(step_dir)
                except OSError:
                    pass
        except (CheckpointError, OSError) as e:
            logger.warning("%s: could not delete an old persistent step (%s)", step_dir, e)


def persistent_part_of(directory: str) -> Any:
    """``(step, owner) -> URL`` of the persistent tier's parts (for the restore plan)."""
    return lambda step, owner: persistent_part(directory, step, owner)


__all__ += ["persistent_part_of", "Part"]
