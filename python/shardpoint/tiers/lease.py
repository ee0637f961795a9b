"""One job per tier directory: the directory locks a ``TieredCheckpointManager`` takes.

Two jobs started on one local directory (or one persistent directory) by mistake would number,
write and delete the same ``ckpt-S`` parts: each one's retention removes the other's steps, and
a restore may combine parts of both. The CheckpointManager's lock (``objgraph.directory_lock``:
an exclusive ``flock`` on the directory, shared by the managers of one process, gone with the
process) is taken on what each rank owns alone, so the ranks of one job never conflict:

- every rank: its subtree of the local tier, ``<local_directory>/rank-RRRRR`` (its own part
  and the replicas it keeps for peers; ranks on one node share the local directory but not
  their subtrees);
- rank 0, which commits and prunes the persistent tier: ``directory`` when it is a local path
  (a bucket has no ``flock``; there the checkpoint-state etag of the CheckpointManager is not
  used either, docs/TIERS.md "Two jobs on one directory").

A second job's ranks then fail in the constructor with ``DirectoryInUseError`` naming the
directory, every rank of it alike (the outcome is all-gathered before anything is written).
"""

from __future__ import annotations

import os

from .. import storage
from ..objgraph import directory_lock
from ..objgraph.errors import DirectoryInUseError

__all__ = ["TierLeases"]

_USER = "a TieredCheckpointManager (or CheckpointManager)"


class TierLeases:
    """This rank's locks on its tier directories; :meth:`release` (idempotent) lets go."""

    def __init__(self, local: str, rank: int, persistent: str) -> None:
        self._leases: list[directory_lock.DirectoryLease] = []
        #: why this rank could not take its locks (None: it holds them)
        self.refused: str | None = None
        dirs = [os.path.join(local, f"rank-{rank:05d}")]
        if rank == 0 and not storage.is_url(persistent):
            dirs.append(persistent)
        try:
            for d in dirs:
                self._leases.append(directory_lock.acquire(d, _USER))
        except DirectoryInUseError as e:
            self.release()
            self.refused = f"rank {rank}: {e}"

    def release(self) -> None:
        leases, self._leases = self._leases, []
        for lease in leases:
            lease.release()
