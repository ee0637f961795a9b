"""After a restore: ranks fetching each other's parts of the restored step.

The tiers restore each rank from its own part. A framework whose ranks also read files other
ranks wrote (DeepSpeed: every rank reads the model-states file data-parallel rank 0 wrote)
asks for those ranks' parts here, in one collective step after the restore: each owner sends
its own copy of the restored step from its local tier (the copy it restored from, or the one
the restore refilled), behind the crc32c of its commit record, so a copy damaged since its
commit is refused on arrival; the receiver checks every file and writes it under
``<local>/rank-RRRRR/fetched-OOOOO/``, a directory no restore counts, removed by
:func:`drop_fetched` (or by local retention, as any uncommitted copy).
"""

from __future__ import annotations

import logging
import os
import shutil

from ..errors import TierError
from .group import Collective, Message
from .layout import COMMIT_SUFFIX, own_dir, part_prefix, read_record
from .parts import decode_parts, encode_parts, map_part_pieces, write_part

__all__ = ["fetch_parts", "drop_fetched", "fetched_dir"]

logger = logging.getLogger("shardpoint")

# a failure is reported to the other ranks in the collective, never raised past it (they would
# wait until the group times out)
_ERRORS = (Exception,)


def fetched_dir(local: str, holder: int, owner: int) -> str:
    return os.path.join(local, f"rank-{holder:05d}", f"fetched-{owner:05d}")


def fetch_parts(
    group: Collective, local: str, step: int, token: str, owners: list[int]
) -> dict[int, str]:
    """This rank's share of one fetch (a collective: every rank calls it, each with the owners
    it wants, maybe none): returns owner -> prefix of that owner's part, checked and written
    here. Raises :class:`TierError` on every rank if any rank's fetch failed."""
    rank = group.rank
    wanted = sorted({int(o) for o in owners} - {rank})
    for o in wanted:
        if not 0 <= o < group.world_size:
            raise TierError(f"rank {rank}: no rank {o} in a job of {group.world_size}")
    requests = group.all_gather(wanted)
    requesters = [r for r, w in enumerate(requests) if rank in w]
    sends: dict[int, Message] = {}
    if requesters:
        own = part_prefix(own_dir(local, rank), step)
        try:
            record = read_record(own + COMMIT_SUFFIX)
            if record is None or str(record["token"]) != token:
                raise TierError(f"{own}: no commit record of the restored save")
            message: Message = map_part_pieces((own, rank, step, token, record.get("files")))[0]
        except _ERRORS as e:
            logger.warning("tiers: %s: cannot send it to ranks %s: %s", own, requesters, e)
            message = encode_parts([])
        sends = {r: message for r in requesters}
    received = group.exchange(sends, wanted)
    out: dict[int, str] = {}
    error: str | None = None
    for owner in wanted:
        try:
            got = [p for p in decode_parts(received[owner], f"rank {owner}") if p.owner == owner]
            if len(got) != 1 or got[0].step != step or got[0].token != token:
                raise TierError(f"rank {owner} could not send its part of step {step}")
            dest = part_prefix(fetched_dir(local, rank, owner), step)
            shutil.rmtree(os.path.dirname(dest), ignore_errors=True)
            # every file checked against the sender's commit record as it is written; a
            # scratch copy, read once and removed: no fsync
            write_part(got[0], dest, durable=False)
            out[owner] = dest
        except _ERRORS as e:
            error = error or f"rank {rank}: part of rank {owner}: {type(e).__name__}: {e}"
    failed = [e for e in group.all_gather(error) if e is not None]
    if failed:
        drop_fetched(local, rank)
        raise TierError(f"fetching parts of step {step} failed: " + "; ".join(failed))
    return out


def drop_fetched(local: str, rank: int) -> None:
    """Remove every part this rank fetched (``fetched-OOOOO`` directories)."""
    root = os.path.join(local, f"rank-{rank:05d}")
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if name.startswith("fetched-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
