"""``CheckpointManager``: numbered saves into a directory with retention.

Crash safety: a save is (1) write the checkpoint (its index is renamed into place last, so it is
complete or absent), (2) atomically replace the state file naming it and the checkpoints still
kept, (3) only then delete the checkpoints that fell out of retention, index first. A crash at
any point leaves ``latest_checkpoint`` naming a complete checkpoint; at worst an unlisted
checkpoint stays on disk.

On an object store (``s3://``, ``gs://``, ``az://``, ``memory://`` directory URLs) there is no
``flock``: one manager per URL is enforced by the state object instead. Each save first checks
(one GET) that the state object is still the version this manager last read or wrote, and the
state update after the commit is a conditional put on that version (``If-Match``, or
``If-None-Match: *`` when there was none). A second manager on the URL therefore gets
:class:`DirectoryInUseError` before it writes anything, or at the latest when it would replace
the state, and never deletes a checkpoint: deletions happen only after its own state update won.
Pending deletions live in an object beside the state object; restore candidates and orphan
shards are found through the store's listing. docs/OBJECT_STORE.md has the details.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import (
    CheckpointError,
    CheckpointIOError,
    CorruptCheckpointError,
    InvalidArgumentError,
    NotFoundError,
)
from ..storage.async_save import SaveFuture
from ..storage.atomic_files import create_temp
from . import directory_lock, storage_io
from .checkpoint import uncount_failed_save
from .checkpoint_state import (
    STATE_FILENAME,
    last_seen_etag,
    read_checkpoint_state,
    read_state_and_etag,
    resolve,
    state_object_etag,
    update_checkpoint_state,
)
from .errors import DirectoryInUseError
from .manager_delta import check_options, max_chain, protect_bases
from .manager_tiers import TIER_ARGUMENTS, tiered_manager
from .shared_reads import run_shared

__all__ = ["CheckpointManager", "PENDING_DELETIONS_FILENAME"]

#: Checkpoints whose deletion failed, retried by the next save (JSON list of names).
PENDING_DELETIONS_FILENAME = ".shardpoint-pending-deletions.json"

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
    ``digest`` (``"sha256"``/``"blake3"``) records strong digests of every save's files
    (FORMAT.md §7.1), checked by ``verify(strong=True)`` and ``shardpoint verify --strong``.
    ``delta=True`` stores each save as a delta checkpoint against the previous one (FORMAT.md
    §11: unchanged tensors cost ~0, slightly changed ones their XOR), a full one every
    ``full_every`` saves (default 8); retention never deletes a checkpoint a kept one needs as
    its base (:mod:`.manager_delta`). Local directories and blocking saves only.
    ``hashed_prefixes=True``: shards under ``ckpt-N/HH/`` (FORMAT.md §3.1.1), not with delta.

    A manager created over an existing directory takes over (may later delete) only the listed
    checkpoints newer than the state file's ``last_preserved_timestamp``, as TensorFlow's does:
    after the clock went backwards, none, so checkpoints kept so far are never deleted.

    With a tier argument (``local_directory=...``, :data:`.manager_tiers.TIER_ARGUMENTS`) the
    call returns a :class:`shardpoint.TieredCheckpointManager` instead, not an instance of this
    class: ``directory`` is its persistent tier (docs/TIERS.md).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the factory shardpoint.tiers registered (never imported here); a subclass keeps its
        # own construction, whatever its keyword arguments are called
        if cls is CheckpointManager and not TIER_ARGUMENTS.isdisjoint(kwargs):
            return tiered_manager(args, kwargs)
        return super().__new__(cls)

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
        digest: str | None = None,
        delta: bool = False,
        full_every: int | None = None,
        hashed_prefixes: bool = False,
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
        # every save's options: strong digests (FORMAT.md §7.1), hashed shard names (§3.1.1)
        self._save_options = {"digest": digest, "hashed_prefixes": bool(hashed_prefixes)}
        self._directory = os.fspath(directory)
        # an object-store URL: no directory lock (no flock on a bucket); the state object's
        # conditional update plays its part (module docstring)
        self._remote = storage_io.is_url(self._directory)
        if self._remote:
            if incremental:
                raise InvalidArgumentError(
                    f"{self._directory}: incremental saves hard-link local files; they are "
                    "not supported on object-store URLs"
                )
            self._directory = self._directory.rstrip("/")
        # etag of the state object this manager last read or wrote (URLs only; None: absent)
        self._state_etag: str | None = None
        # the start-of-save check (foreground) and the state update with its etag (background
        # for asynchronous saves) must not interleave, or the check would see a half-done update
        self._etag_lock = threading.Lock()
        # one manager process per directory (directory_lock); taken now if the directory
        # exists (a resumed job), else when the first save creates it
        self._lease: directory_lock.DirectoryLease | None = None
        self._ensure_lease()
        # checkpoints whose deletion failed: retried by every save (persisted, see below)
        self._pending_deletions: list[str] = self._read_pending()
        self._max_to_keep = max_to_keep
        self._keep_every_n_hours = keep_checkpoint_every_n_hours
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._incremental = bool(incremental)
        # delta saves: the longest chain below a save (None: delta off)
        self._delta_chain: int | None = None
        if delta:
            k = check_options(full_every, self._remote, self._incremental, digest, hashed_prefixes)
            self._delta_chain = max_chain(k)
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
        # one read for the whole job when a shared-read runner is installed (shared_reads)
        state, etag = read_state_and_etag(self._directory)
        if self._remote:
            self._state_etag = etag
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

    # -- directory ownership and deletions that must be retried ---------------------------------
    def _ensure_lease(self) -> None:
        if self._remote:
            return  # no flock on a bucket: the state object's etag guards it (module docstring)
        if self._lease is None and os.path.isdir(self._directory or "."):
            self._lease = directory_lock.acquire(self._directory)
            weakref.finalize(self, self._lease.release)

    def close(self) -> None:
        """Give up this manager's share of the directory lock (also done when it is garbage
        collected); another process may then manage the directory."""
        if self._lease is not None:
            self._lease.release()

    def _pending_path(self) -> str:
        return os.path.join(self._directory, PENDING_DELETIONS_FILENAME)

    def _read_pending(self) -> list[str]:
        try:
            if self._remote:
                raw = storage_io.read_small(self._pending_path())
                if raw is None:
                    return []
                names = json.loads(raw.decode("utf-8"))
            else:
                with open(self._pending_path(), encoding="utf-8") as f:
                    names = json.load(f)
        except (OSError, ValueError, CheckpointError) as e:
            if self._remote:
                logger.warning("%s: could not read checkpoints to delete: %s", self._directory, e)
            return []
        if not isinstance(names, list):
            return []
        return [os.path.join(self._directory, n) for n in names if isinstance(n, str)]

    def _write_pending(self) -> None:
        """Persist the retry list (so a failed deletion is retried after a restart too)."""
        path = self._pending_path()
        if self._remote:
            try:
                if self._pending_deletions:
                    names = [p.rsplit("/", 1)[-1] for p in self._pending_deletions]
                    storage_io.write_small(path, json.dumps(names).encode("utf-8"))
                else:
                    storage_io.delete_name(path)
            except CheckpointError as e:
                logger.warning("%s: could not record checkpoints to delete later: %s", path, e)
            return
        try:
            if not self._pending_deletions:
                if os.path.exists(path):
                    os.unlink(path)
                return
            names = [os.path.basename(p) for p in self._pending_deletions]
            fd, tmp = create_temp(self._directory, PENDING_DELETIONS_FILENAME + ".", ".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(names, f)
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("%s: could not record checkpoints to delete later: %s", path, e)

    def _delete(self, paths: list[str], keep: str) -> None:
        """Delete ``paths`` (never ``keep``); failures are logged and kept for the next save."""
        failed: list[str] = []
        for old_path in dict.fromkeys(paths):
            if old_path == keep or old_path in self._maybe_delete:
                continue
            try:
                storage_io.remove_checkpoint(old_path)
            except (NotFoundError, FileNotFoundError):
                pass
            except (CheckpointError, OSError) as e:
                logger.warning(
                    "could not delete old checkpoint %s (%s); it is no longer listed and the "
                    "next save retries the deletion",
                    old_path,
                    e,
                )
                failed.append(old_path)
        if failed != self._pending_deletions:
            self._pending_deletions = failed
            self._write_pending()

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
        :class:`~shardpoint.storage.async_save.SaveFuture` whose result is what the blocking call
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
                    return None if blocking else SaveFuture.completed(None)
        check = getattr(self._checkpoint, "_sp_check", None)
        if callable(check):
            check()  # an earlier failure raises before the counter moves
        if self._remote:
            self._check_state_unchanged()  # before anything is written or counted
        counter = self._checkpoint.save_counter
        counter.assign_add(1)
        number = int(counter) if checkpoint_number is None else int(checkpoint_number)
        path = f"{self._prefix}-{number}"
        stamp = _now()
        if not self._remote:
            os.makedirs(self._directory or ".", exist_ok=True)
        self._ensure_lease()
        try:
            if not hasattr(self._checkpoint, "_write"):  # a duck-typed checkpoint: write() only
                if self._delta_chain is not None:
                    raise ValueError("delta=True needs an sp.Checkpoint")
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
                    **self._save_options,
                    **({} if self._delta_chain is None else {"delta": self._delta_chain}),
                )
        except BaseException as e:
            uncount_failed_save(counter, path)
            # Failed after its commit (e.g. the directory fsync)? Then it is on disk: list it,
            # so it is restored from and deleted like any other, and still raise. Not after
            # losing the state object to another manager (URLs): that would lose again.
            if (
                blocking
                and not isinstance(e, DirectoryInUseError)
                and path not in self._maybe_delete
                and storage_io.checkpoint_exists(path)
            ):
                try:
                    self._record_and_sweep(path, stamp)
                except Exception as e:  # the save's own error is the one to report
                    logger.warning("could not record checkpoint %s: %s", path, e)
            raise
        if step is not None:
            self._last_checkpoint_step = step
        return result

    def wait(self, timeout: float | None = None) -> None:
        """Block until every asynchronous save has committed (and old checkpoints are
        rotated out); raise the first error of a save nobody has seen yet."""
        wait = getattr(self._checkpoint, "wait", None)
        if callable(wait):
            wait(timeout)

    def _check_state_unchanged(self) -> None:
        """URLs: raise DirectoryInUseError unless the state object is still the version this
        manager last read or wrote (another manager saved into the URL meanwhile)."""
        with self._etag_lock:
            current = state_object_etag(self._directory)
            mine = self._state_etag
        if current != mine:
            raise DirectoryInUseError(
                f"{self._directory}/{STATE_FILENAME}: the state object was changed by someone "
                "else since this CheckpointManager last read or wrote it (another manager or "
                "job saving into this URL?); nothing was written. Two managers on one URL "
                "would delete each other's checkpoints: stop the other job or give this one "
                "its own URL, then create a new manager"
            )

    def _record_and_sweep(self, path: str, timestamp: float) -> None:
        # computed on copies and adopted only once the state write succeeded, so a failed
        # (or, on a URL, lost) state update leaves this manager's view and deletions untouched
        kept = OrderedDict(self._maybe_delete)
        kept.pop(path, None)
        kept[path] = timestamp
        preserved = self._last_preserved_timestamp
        doomed: list[str] = []
        stamps: dict[str, float] = {}
        if self._max_to_keep is not None:
            while len(kept) > self._max_to_keep:
                old_path, old_stamp = kept.popitem(last=False)
                if self._keep_every_n_hours is not None and (
                    old_stamp - self._keep_every_n_hours * 3600.0 >= preserved
                ):
                    preserved = old_stamp
                    continue  # preserved: stays on disk, no longer listed
                doomed.append(old_path)
                stamps[old_path] = old_stamp
        if self._delta_chain is not None:  # a base a kept checkpoint needs stays
            doomed = protect_bases(doomed, kept, self._on_disk, stamps)
        # one atomic state write that already excludes the doomed checkpoints, then delete
        args = (self._directory, path, list(kept), list(kept.values()), preserved)
        if not self._remote:
            update_checkpoint_state(*args)
        else:
            try:
                with self._etag_lock:
                    update_checkpoint_state(*args, etag=self._state_etag)
                    self._state_etag = last_seen_etag(self._directory)
            except CheckpointIOError as e:
                if "another writer changed it first" not in str(e):
                    raise
                raise DirectoryInUseError(
                    f"{self._directory}/{STATE_FILENAME}: another CheckpointManager (or job) "
                    f"updated the state object while this one saved {path}; the state object "
                    f"was left as the other wrote it and nothing was deleted ({path} is not "
                    "listed). Two managers on one URL would delete each other's checkpoints: "
                    "stop the other job or give this one its own URL"
                ) from None
        self._maybe_delete = kept
        self._last_preserved_timestamp = preserved
        self._latest_checkpoint = path
        # the new checkpoint is committed and listed: deletion failures no longer fail the save
        self._delete(self._pending_deletions + doomed, keep=path)
        self._sweep_orphans(path)

    def _on_disk(self) -> list[str]:
        """Every checkpoint of this manager's prefix that has an index (listed or not)."""
        base = os.path.basename(self._prefix)
        names = storage_io.list_names(self._directory)
        heads = [n[: -len(".index")] for n in names if n.endswith(".index")]
        return [os.path.join(self._directory, h) for h in heads if _number_of(h, base) is not None]

    def _sweep_orphans(self, path: str) -> None:
        """Remove shard files (``ckpt-N.data-…``, hashed ``ckpt-N/HH/data-…``) of numbered
        checkpoints below the one just saved that have no index: leftovers of a deletion cut
        short by a crash. Higher numbers are left alone: a save may be in flight there."""
        base = os.path.basename(self._prefix)
        current = _number_of(os.path.basename(path), base)
        if current is None:
            return
        try:
            names, dirs = storage_io.list_files_and_dirs(self._directory)
        except CheckpointError as e:
            logger.warning("%s: could not list for orphaned shards: %s", self._directory, e)
            return
        below = [d for d in dirs if (n := _number_of(d, base)) is not None and n < current]
        storage_io.remove_hashed_orphans(self._directory, below, listed=names)
        exists: dict[str, bool] = {}
        for name in names:
            head, sep, _ = name.partition(".data-")
            n = _number_of(head, base) if sep else None
            if n is None or n >= current or name.endswith(".upload"):  # .upload: gc's (§8.2)
                continue
            prefix = os.path.join(self._directory, head)
            if head not in exists:
                exists[head] = storage_io.checkpoint_exists(prefix)
            if not exists[head]:
                with contextlib.suppress(OSError, CheckpointError):
                    storage_io.delete_name(os.path.join(self._directory, name))

    # -- restoring -------------------------------------------------------------------------------
    def restore_or_initialize(self, *, strict: bool = False) -> str | None:
        """Restore the newest intact checkpoint and return its path, else call ``init_fn``.

        Newest first: the state file's latest, its listed checkpoints, then numbered
        checkpoints found on disk. One whose index is missing (a partial copy) or that is
        damaged (a checksum mismatch, a missing or truncated shard) is skipped with a warning
        naming it and why, and the next is restored; ``strict=True`` raises instead. Nothing
        is silently started from scratch while an intact checkpoint exists.
        """
        skipped: list[tuple[str, str]] = []
        # the listing and the index checks: once for the job with a shared-read runner
        candidates = run_shared(
            lambda: [(p, storage_io.checkpoint_exists(p)) for p in self._restore_candidates()]
        )
        for path, exists in candidates:
            if not exists:
                skipped.append((path, "its index is missing"))
                continue
            try:
                self._checkpoint.restore(path)
            except (CorruptCheckpointError, NotFoundError, CheckpointIOError) as e:
                if strict:
                    raise
                skipped.append((path, f"{type(e).__name__}: {e}"))
                continue
            if skipped:
                self._warn_skipped(skipped, path, strict)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = int(self._step_counter)
            return path
        if skipped:
            damaged = [s for s in skipped if s[1] != "its index is missing"]
            if damaged or strict:
                raise CorruptCheckpointError(
                    f"{self._directory}: no intact checkpoint to restore; "
                    + "; ".join(f"{p}: {why}" for p, why in skipped)
                )
            logger.warning(
                "%s: the checkpoints the state file names are gone (%s); initializing",
                self._directory,
                ", ".join(p for p, _ in skipped),
            )
        if self._init_fn is not None:
            self._init_fn()
        return None

    def _warn_skipped(self, skipped: list[tuple[str, str]], used: str, strict: bool) -> None:
        if strict:
            raise CorruptCheckpointError(
                f"{self._directory}: newest checkpoint is not intact ("
                + "; ".join(f"{p}: {why}" for p, why in skipped)
                + ")"
            )
        logger.warning(
            "restored %s, skipping newer checkpoints that are not intact: %s",
            used,
            "; ".join(f"{p} ({why})" for p, why in skipped),
        )

    def _restore_candidates(self) -> list[str]:
        """Checkpoint prefixes to try, newest first, without duplicates."""
        out: list[str] = []
        state = read_checkpoint_state(self._directory)
        if state is not None:
            out.append(resolve(self._directory, state.model_checkpoint_path))
            out += [resolve(self._directory, p) for p in reversed(state.all_model_checkpoint_paths)]
        base = os.path.basename(self._prefix)
        try:
            names = storage_io.list_names(self._directory)
        except CheckpointError as e:  # a bucket that cannot be listed: the state's list only
            logger.warning("%s: could not list for checkpoints: %s", self._directory, e)
            names = []
        numbered = []
        for name in names:
            if name.endswith(".index"):
                n = _number_of(name[: -len(".index")], base)
                if n is not None:
                    numbered.append((n, os.path.join(self._directory, name[: -len(".index")])))
        out += [p for _, p in sorted(numbered, reverse=True)]
        return list(dict.fromkeys(out))


def _number_of(name: str, base: str) -> int | None:
    """N of a checkpoint file prefix ``<base>-N``, else None."""
    if not name.startswith(base + "-"):
        return None
    tail = name[len(base) + 1 :]
    return int(tail) if tail.isdigit() else None
