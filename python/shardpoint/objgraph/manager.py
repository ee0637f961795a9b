"""``CheckpointManager``: numbered saves into a directory with retention.

Crash safety: a save is (1) write the checkpoint (its index is renamed into place last, so it is
complete or absent), (2) atomically replace the state file naming it and the checkpoints still
kept, (3) only then delete the checkpoints that fell out of retention, index first. A crash at
any point leaves ``latest_checkpoint`` naming a complete checkpoint; at worst an unlisted
checkpoint stays on disk.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..async_save import SaveFuture
from ..errors import NotFoundError
from . import storage_io
from .checkpoint_state import (
    latest_checkpoint,
    read_checkpoint_state,
    resolve,
    update_checkpoint_state,
)

__all__ = ["CheckpointManager"]

logger = logging.getLogger("shardpoint")


def _now() -> float:
    """Wall clock; a separate function so tests can move time."""
    return time.time()


class CheckpointManager:
    """Save numbered checkpoints of ``checkpoint`` into ``directory``, keeping the newest few.

    ``max_to_keep`` (positive int or None = keep all); ``keep_checkpoint_every_n_hours`` keeps,
    in addition, one checkpoint per that many hours (it leaves the listed set but stays on disk);
    ``checkpoint_name`` is the file prefix (``<directory>/<name>-<n>``); with ``step_counter`` and
    ``checkpoint_interval``, ``save()`` writes only when at least that many steps have passed;
    ``init_fn`` is called by ``restore_or_initialize()`` when there is nothing to restore;
    ``last_checkpoint_step`` seeds the step of the last save for the ``checkpoint_interval``
    check (as the ``last_checkpoint_step`` property, e.g. after restoring a step counter).

    A manager created over an existing directory takes over (may later delete) only the listed
    checkpoints newer than the state file's ``last_preserved_timestamp``, as TensorFlow's does:
    after the clock went backwards, none, so checkpoints kept so far are never deleted.
    """

    def __init__(
        self,
        checkpoint: Any,
        directory: str | os.PathLike,
        max_to_keep: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
        last_checkpoint_step: int | None = None,
        *,
        incremental: bool = False,
        max_in_flight: int | None = None,
    ) -> None:
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep <= 0
        ):
            raise ValueError(
                f"Expected a positive integer or `None` for `max_to_keep`, got {max_to_keep}."
            )
        if checkpoint_interval is not None and step_counter is None:
            raise ValueError(
                "`step_counter` should be passed if `checkpoint_interval` is not None."
            )
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._max_to_keep = max_to_keep
        self._keep_every_n_hours = keep_checkpoint_every_n_hours
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._incremental = bool(incremental)
        if max_in_flight is not None:
            checkpoint.max_in_flight = max_in_flight
        self._last_checkpoint_step: int | None = (
            None if last_checkpoint_step is None else int(last_checkpoint_step)
        )
        # path -> timestamp of the checkpoints this manager may delete, oldest first
        self._maybe_delete: OrderedDict[str, float] = OrderedDict()
        now = _now()
        self._last_preserved_timestamp = now
        self._latest_checkpoint: str | None = None
        state = read_checkpoint_state(self._directory)
        if state is None:
            return
        self._latest_checkpoint = resolve(self._directory, state.model_checkpoint_path)
        stamps = state.all_model_checkpoint_timestamps
        paths = state.all_model_checkpoint_paths
        if state.last_preserved_timestamp is not None:
            self._last_preserved_timestamp = state.last_preserved_timestamp
        if self._last_preserved_timestamp > now:
            logger.warning(
                "time.time() returned a value %f seconds behind the last preserved checkpoint "
                "timestamp. Clamping stored timestamps so no checkpoint is deleted by mistake.",
                self._last_preserved_timestamp - now,
            )
            self._last_preserved_timestamp = now
        # checkpoints written by plain Checkpoint.save() carry no timestamps: they can be the
        # latest checkpoint but are never managed (listed or deleted) by a manager (MGR-07).
        # Only checkpoints newer than the last preserved timestamp are taken over; clamping to
        # now means that after a clock reset none are (TensorFlow's rule).
        if len(stamps) == len(paths):
            for path, stamp in zip(paths, stamps, strict=True):
                stamp = min(stamp, now)
                if stamp > self._last_preserved_timestamp:
                    self._maybe_delete[resolve(self._directory, path)] = stamp

    # -- properties ------------------------------------------------------------------------------
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def checkpoint(self) -> Any:
        return self._checkpoint

    @property
    def checkpoints(self) -> list[str]:
        """Managed checkpoints still kept, oldest first."""
        return list(self._maybe_delete)

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint of the directory (managed or not), or None."""
        return self._latest_checkpoint

    @property
    def checkpoint_interval(self) -> int | None:
        return self._checkpoint_interval

    @property
    def last_checkpoint_step(self) -> int | None:
        """Step of the last save (seeds the ``checkpoint_interval`` check)."""
        return self._last_checkpoint_step

    @last_checkpoint_step.setter
    def last_checkpoint_step(self, step: int | None) -> None:
        self._last_checkpoint_step = None if step is None else int(step)

    # -- saving ----------------------------------------------------------------------------------
    def save(
        self,
        checkpoint_number: Any = None,
        check_interval: bool = True,
        options: Any = None,
        *,
        blocking: bool = True,
    ) -> Any:
        """Write a numbered checkpoint; returns its prefix, or None when the interval says wait.

        ``checkpoint_number`` (an int or an integer Variable, read not incremented) overrides
        the number; ``save_counter`` is incremented either way.

        ``blocking=False`` (or ``options.experimental_enable_async_checkpoint``) returns a
        :class:`~shardpoint.async_save.SaveFuture` whose result is what the blocking call
        returns, once every value has been copied to host memory. The write, then the state
        file update and the deletion of checkpoints out of retention, run in the background in
        call order: ``latest_checkpoint`` and ``checkpoints`` only ever name committed
        checkpoints. Errors raise on the future, else on the next save or :meth:`wait`.
        """
        blocking = bool(blocking) and not getattr(
            options, "experimental_enable_async_checkpoint", False
        )
        step = None
        if self._checkpoint_interval is not None:
            step = int(self._step_counter)
            last = self._last_checkpoint_step
            if last is not None:
                if step == last or (check_interval and step < last + self._checkpoint_interval):
                    return None if blocking else _done(None)
        check = getattr(self._checkpoint, "_sp_check", None)
        if callable(check):
            check()  # an earlier failure raises before the counter moves
        counter = self._checkpoint.save_counter
        counter.assign_add(1)
        number = int(counter) if checkpoint_number is None else int(checkpoint_number)
        path = f"{self._prefix}-{number}"
        stamp = _now()
        if not hasattr(self._checkpoint, "_write"):  # a duck-typed checkpoint: write() only
            if not blocking:
                raise ValueError("blocking=False needs an sp.Checkpoint")
            path = self._checkpoint.write(path)
            result: Any = path
            self._record_and_sweep(path, stamp)
        else:
            result = self._checkpoint._write(
                path,
                blocking,
                self._incremental,
                then=lambda: self._record_and_sweep(path, stamp),
                base=lambda: self._latest_checkpoint,
            )
        if step is not None:
            self._last_checkpoint_step = step
        return result

    def wait(self, timeout: float | None = None) -> None:
        """Block until every asynchronous save has committed (and old checkpoints are
        rotated out); raise the first error of a save nobody has seen yet."""
        wait = getattr(self._checkpoint, "wait", None)
        if callable(wait):
            wait(timeout)

    def _record_and_sweep(self, path: str, timestamp: float) -> None:
        self._maybe_delete.pop(path, None)
        self._maybe_delete[path] = timestamp
        self._latest_checkpoint = path
        doomed: list[str] = []
        if self._max_to_keep is not None:
            while len(self._maybe_delete) > self._max_to_keep:
                old_path, old_stamp = self._maybe_delete.popitem(last=False)
                if self._keep_every_n_hours is not None and (
                    old_stamp - self._keep_every_n_hours * 3600.0 >= self._last_preserved_timestamp
                ):
                    self._last_preserved_timestamp = old_stamp
                    continue  # preserved: stays on disk, no longer listed
                doomed.append(old_path)
        # one atomic state write that already excludes the doomed checkpoints, then delete
        update_checkpoint_state(
            self._directory,
            path,
            list(self._maybe_delete),
            list(self._maybe_delete.values()),
            self._last_preserved_timestamp,
        )
        for old_path in doomed:
            if old_path == path:
                continue
            try:
                storage_io.remove_checkpoint(old_path)
            except (NotFoundError, FileNotFoundError):
                pass
        self._sweep_orphans(path)

    def _sweep_orphans(self, path: str) -> None:
        """Remove shard files of numbered checkpoints below the one just saved that have no
        index: leftovers of a deletion (index first, then shards) cut short by a crash. Higher
        numbers are left alone: a save may be in flight there."""
        base = os.path.basename(self._prefix)
        current = _number_of(os.path.basename(path), base)
        if current is None:
            return
        try:
            names = os.listdir(self._directory)
        except OSError:
            return
        for name in names:
            head, sep, _ = name.partition(".data-")
            n = _number_of(head, base) if sep else None
            if n is None or n >= current:
                continue
            prefix = os.path.join(self._directory, head)
            if not storage_io.checkpoint_exists(prefix):
                try:
                    os.unlink(os.path.join(self._directory, name))
                except OSError:
                    pass

    # -- restoring -------------------------------------------------------------------------------
    def restore_or_initialize(self) -> str | None:
        """Restore the latest checkpoint and return its path, else call ``init_fn``; no status."""
        latest = latest_checkpoint(self._directory)
        if latest is not None:
            self._checkpoint.restore(latest)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = int(self._step_counter)
            return latest
        if self._init_fn is not None:
            self._init_fn()
        return None


def _done(value: Any) -> SaveFuture:
    """A future that already holds ``value`` (an asynchronous save that had nothing to do)."""
    f = SaveFuture()
    f.set_result(value)
    return f


def _number_of(name: str, base: str) -> int | None:
    """N of a checkpoint file prefix ``<base>-N``, else None."""
    if not name.startswith(base + "-"):
        return None
    tail = name[len(base) + 1 :]
    return int(tail) if tail.isdigit() else None
