"""The collectives the tiers need, over the job's own ``torch.distributed`` group.

Nothing here starts a service: a tiered manager in a job with an initialized process group
makes two gloo subgroups of it (``dist.new_group``, a collective every rank makes at
construction), one for the local tier's background thread and one for the persistent tier's,
so the two threads never interleave collectives on one group. Each thread runs its saves in
call order, so every rank issues the same collectives in the same order. Without an
initialized group (one process), :class:`SingleProcess` answers the same calls locally.

torch is imported only when a group is used, so the tiers work without it in one process.
"""

from __future__ import annotations

import abc
import datetime
import sys
from typing import Any

__all__ = ["Collective", "SingleProcess", "TorchGroup", "job_groups", "Message"]

#: a message: one buffer, or pieces sent one after the other and received as one buffer
Message = bytearray | memoryview | list[bytes | memoryview]
#: the most pieces one message may announce (a part's files and its header)
_MAX_PIECES = (1 << 16) + 1


class Collective(abc.ABC):
    """What the tiers ask of a group: rank, size, gathering small objects, sending bytes (an
    abstract base: the single process and the torch.distributed group implement it)."""

    rank: int = 0
    world_size: int = 1

    @abc.abstractmethod
    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (small, JSON-able), in rank order."""

    @abc.abstractmethod
    def exchange(self, sends: dict[int, Message], sources: list[int]) -> dict[int, memoryview]:
        """Send ``sends[dst]`` to each ``dst`` while receiving one message from each rank in
        ``sources``; every rank calls it in the same collective step. At most one message
        per ordered pair of ranks. A message given as a list of pieces is sent piece by piece
        (no copy into one buffer) and received joined, as one buffer."""


class SingleProcess(Collective):
    """The group of one process: gathering returns the object, nothing is ever sent."""

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def exchange(self, sends: dict[int, Message], sources: list[int]) -> dict[int, memoryview]:
        if sends or sources:
            raise ValueError("a single process has no peers to send to")
        return {}


class TorchGroup(Collective):
    """A gloo group over every rank of the job's default group (CPU tensors, any device)."""

    def __init__(self, timeout: datetime.timedelta | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        kwargs: dict[str, Any] = {"backend": "gloo"}
        if timeout is not None:
            kwargs["timeout"] = timeout
        self._pg = dist.new_group(**kwargs)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self._pg)
        return out

    def exchange(self, sends: dict[int, Message], sources: list[int]) -> dict[int, memoryview]:
        """Per message: the number of pieces, their lengths, then each non-empty piece (its
        own memory, viewed by torch without a copy); the receiver checks the announced sizes
        before allocating one buffer and receives each piece into its place in it."""
        import torch

        dist = self._dist
        works = []
        keep: list[Any] = []  # what pending sends read must stay alive until they complete
        for dst, data in sorted(sends.items()):
            pieces = data if isinstance(data, list) else [data]
            count = torch.tensor([len(pieces)], dtype=torch.int64)
            lengths = torch.tensor([len(p) for p in pieces], dtype=torch.int64)
            keep += [count, lengths]
            works.append(dist.isend(count, dst, group=self._pg, tag=1))
            works.append(dist.isend(lengths, dst, group=self._pg, tag=2))
            for piece in pieces:
                if len(piece):
                    if isinstance(piece, bytes):
                        piece = bytearray(piece)  # torch views writable memory only
                    buf = torch.frombuffer(piece, dtype=torch.uint8)
                    keep.append(buf)
                    works.append(dist.isend(buf, dst, group=self._pg, tag=3))
        out: dict[int, memoryview] = {}
        for src in sorted(sources):
            count = torch.empty(1, dtype=torch.int64)
            dist.recv(count, src, group=self._pg, tag=1)
            k = int(count.item())
            if k < 1 or k > _MAX_PIECES:
                raise ValueError(f"rank {src} announced a message of {k} pieces")
            lengths = torch.empty(k, dtype=torch.int64)
            dist.recv(lengths, src, group=self._pg, tag=2)
            sizes = [int(n) for n in lengths.tolist()]
            total = sum(sizes)
            if min(sizes) < 0 or total <= 0 or total > (1 << 40):
                raise ValueError(f"rank {src} announced a message of pieces {sizes[:8]}...")
            buf = torch.empty(total, dtype=torch.uint8)
            at = 0
            for n in sizes:
                if n:
                    dist.recv(buf[at : at + n], src, group=self._pg, tag=3)
                at += n
            out[src] = memoryview(buf.numpy()).cast("B")
        for w in works:
            w.wait()
        return out


def job_groups(
    process_group: Any, timeout: datetime.timedelta | None
) -> tuple[Collective, Collective]:
    """Two collectives (local tier, persistent tier) for this job: gloo subgroups of the
    initialized default group, else single-process ones. ``process_group=False`` forces the
    single-process form even inside a job (every rank then works alone)."""
    if process_group is False:
        return SingleProcess(), SingleProcess()
    if process_group is None and "torch.distributed" not in sys.modules:
        # nobody initialized a group (that imports it): no 2 s import of torch to learn so
        return SingleProcess(), SingleProcess()
    try:
        import torch.distributed as dist
    except ImportError:
        return SingleProcess(), SingleProcess()
    if not (dist.is_available() and dist.is_initialized()):
        return SingleProcess(), SingleProcess()
    return TorchGroup(timeout), TorchGroup(timeout)
