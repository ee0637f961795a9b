"""shardpoint's errors as ``torch.distributed.checkpoint`` raises them from its fronts.

DCP raises every failure of a load as its ``CheckpointException`` (a ``BaseException``); code
written against DCP catches that, and code written against shardpoint catches our classes
and the builtins under them (``FileNotFoundError``, ``ValueError``). The DCP fronts
(``_shardpoint_loaders/dcp_reader.py``) refuse a damaged checkpoint of ours before DCP's load
starts, so their error is raised as one of these: our class, DCP's class and an
``Exception`` at once, with our one-line message (not DCP's per-rank traceback dump) and, as
DCP's own errors do, the rank's failure in :attr:`failures`.
"""

from __future__ import annotations

import traceback
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointError, CorruptCheckpointError, NotFoundError

__all__ = [
    "DCPCheckpointError",
    "DCPCorruptCheckpointError",
    "DCPNotFoundError",
    "as_dcp_error",
]


class DCPCheckpointError(CheckpointError, CheckpointException):
    """A shardpoint error raised through DCP: both a :class:`~shardpoint.errors.CheckpointError`
    and DCP's ``CheckpointException``."""

    def __init__(self, message: str, failures: dict[int, Any] | None = None) -> None:
        CheckpointError.__init__(self, message)
        self._failures = dict(failures or {})

    def __str__(self) -> str:
        # our message, not CheckpointException's listing of every rank's traceback
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        # the failures hold tracebacks, which do not pickle: the message crosses processes
        return (type(self), (str(self),))


class DCPNotFoundError(NotFoundError, DCPCheckpointError):
    """:class:`~shardpoint.errors.NotFoundError` (a ``FileNotFoundError``) through DCP."""


class DCPCorruptCheckpointError(CorruptCheckpointError, DCPCheckpointError):
    """:class:`~shardpoint.errors.CorruptCheckpointError` (a ``ValueError``) through DCP."""


def as_dcp_error(err: CheckpointError) -> DCPCheckpointError:
    """``err`` as the DCP class of its kind (already one: itself), its rank's failure kept as
    DCP keeps them (``{rank: (error, traceback)}``)."""
    if isinstance(err, DCPCheckpointError):
        return err
    cls = (
        DCPNotFoundError
        if isinstance(err, NotFoundError)
        else DCPCorruptCheckpointError
        if isinstance(err, CorruptCheckpointError)
        else DCPCheckpointError
    )
    failure = (err, traceback.extract_tb(err.__traceback__))
    return cls(str(err), {_rank(): failure})


def _rank() -> int:
    """This process's rank in the default group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
