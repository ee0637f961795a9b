"""``TieredCheckpointManager``: a local tier every k steps, peer replicas, a persistent tier
every m steps written in the background from the local copy, and a restore that takes each
rank's part from the cheapest tier holding the newest complete step.

A save (every rank calls it with the same step, in the same order):

- foreground: ``checkpoint.write(<local>/rank-R/own/ckpt-S, blocking=False)``: the values are
  copied into reusable host buffers (one memcpy) and the call returns;
- local thread: wait for the part to commit; send it (files and their crc32c, as written) to
  this rank's replica peers and receive the parts this rank keeps for others, each checked and
  written index-last; all-gather "durable?"; only if every rank said yes write the commit
  records (own part, then replicas); then local retention; if the step is due for the
  persistent tier, hand it to the persistent thread;
- persistent thread: persistent.upload_step (read back from the local copy, checked against
  the local record, uploaded, committed by rank 0).

A rank dying anywhere before the agreement leaves no record for that step on any rank (the
collective fails on the others), so the step never counts. After the agreement, every part
and replica is durable, so any record written makes the step genuinely complete.

docs/TIERS.md has the model, the layout, the fault points and the recovery-time model.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import secrets
import socket
import threading
import weakref
from collections.abc import Callable
from concurrent import futures
from typing import Any

from .. import storage
from ..errors import InvalidArgumentError, TierError
from ..objgraph.errors import DirectoryInUseError
from ..storage.async_save import SaveFuture
from .faults import fault_point
from .group import Message, job_groups
from .layout import (
    COMMIT_SUFFIX,
    committed_copies,
    local_steps,
    own_dir,
    part_prefix,
    persistent_steps,
    read_record,
    remove_copy,
    replica_dir,
    write_record,
)
from .lease import TierLeases
from .parts import (
    Part,
    PartSpec,
    decode_parts,
    encode_parts,
    file_list,
    map_part_pieces,
    read_part,
    sync_part,
    write_part,
)
from .persistent import apply_retention, persistent_part_of, upload_step
from .plan import PartSource, RestorePlan, choose_plan

__all__ = ["TieredCheckpointManager"]

logger = logging.getLogger("shardpoint")

# anything a rank hits while the others wait in a collective is reported to them, never raised
# past the collective (that would leave them waiting until the group times out)
_ERRORS = (Exception,)


def _positive(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")


class TieredCheckpointManager:
    """Checkpoints of ``checkpoint`` (an ``sp.Checkpoint`` holding this rank's state) in tiers.

    ``local_directory``: this node's fast directory (tmpfs or NVMe); ``local_every``: local
    saves every that many steps; ``directory``: the persistent tier (a path or an ``s3://``,
    ``gs://``, ``az://`` URL), written every ``persistent_every`` steps; ``replicas``: how many
    other nodes keep a copy of each rank's local part (peers ``rank + k * jump``, ``jump`` =
    ``replication_jump`` or the ranks on this node); ``local_max_to_keep`` / ``max_to_keep``:
    retention per tier. In a job with an initialized ``torch.distributed`` group the manager
    uses gloo subgroups of it (created here: every rank must construct the manager); else it
    works alone. ``init_fn`` runs when nothing is restored. ``compression``: the codec of the
    local parts, which the replicas and the persistent tier receive byte for byte (default
    None: stored as is, so a restore copies instead of decoding; ``"zstd"`` makes them
    smaller), given to ``checkpoint.write`` when it takes a ``compression`` argument.
    ``hashed_prefixes=True``: every part's shards at ``ckpt-S/HH/data-…`` (FORMAT.md §3.1.1),
    so the persistent tier's object keys spread over 256 prefixes (``checkpoint.write`` must
    take that argument).
    """

    def __init__(
        self,
        checkpoint: Any,
        directory: str | os.PathLike[str],
        *,
        local_directory: str | os.PathLike[str],
        local_every: int = 10,
        persistent_every: int = 1000,
        replicas: int = 1,
        replication_jump: int | None = None,
        max_to_keep: int | None = 5,
        local_max_to_keep: int = 2,
        init_fn: Callable[[], Any] | None = None,
        process_group: Any = None,
        timeout: datetime.timedelta | None = None,
        compression: str | None = None,
        hashed_prefixes: bool = False,
    ) -> None:
        _positive("local_every", local_every)
        _positive("persistent_every", persistent_every)
        _positive("local_max_to_keep", local_max_to_keep)
        _positive("max_to_keep", max_to_keep, allow_none=True)
        _positive("replication_jump", replication_jump, allow_none=True)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise InvalidArgumentError(f"replicas must be an integer >= 0, got {replicas!r}")
        if not callable(getattr(checkpoint, "write", None)):
            raise InvalidArgumentError("checkpoint must have write(prefix, blocking=...)")
        self._checkpoint = checkpoint
        self._write_options = _write_options(checkpoint.write, compression, hashed_prefixes)
        self._directory = os.fspath(directory)
        if storage.is_url(self._directory):
            self._directory = self._directory.rstrip("/")
        self._local = os.path.abspath(os.fspath(local_directory))
        if os.path.abspath(self._directory) == self._local:
            raise InvalidArgumentError(f"{self._local}: the local and persistent tiers must differ")
        self._local_every = local_every
        self._persistent_every = persistent_every
        self._max_to_keep = max_to_keep
        self._local_max_to_keep = local_max_to_keep
        self._init_fn = init_fn
        self._group, self._pgroup = job_groups(process_group, timeout)
        self.rank, self.world_size = self._group.rank, self._group.world_size
        # one job per directory (lease.py): every rank learns whether any rank was refused
        self._leases = TierLeases(self._local, self.rank, self._directory)
        weakref.finalize(self, self._leases.release)
        # nodes: ranks sharing one local directory on one host (the same all-gather)
        where = self._group.all_gather(
            [socket.gethostname(), os.path.realpath(self._local), self._leases.refused]
        )
        refused = [w[2] for w in where if w[2]]
        if refused:
            self._leases.release()
            raise DirectoryInUseError(refused[0])
        names = list(dict.fromkeys((w[0], w[1]) for w in where))
        self._node_of = [names.index((w[0], w[1])) for w in where]
        self._targets = self._replica_targets(replicas, replication_jump)
        self._sources = [r for r in range(self.world_size) if self.rank in self._targets[r]]
        # one token per manager (agreed), one counter per save: "<run>.<n>" names a save
        self._run = str(self._group.all_gather(secrets.token_hex(6))[0])
        self._seq = 0
        self._pinned: set[int] = set()  # steps whose persistent upload still reads the local copy
        self._pin_lock = threading.Lock()
        self._plan: RestorePlan | None = None
        self._latest: int | None = None
        self._last_saved: int | None = None
        from .worker import OrderedWorker

        self._local_worker = OrderedWorker("shardpoint-tier-local")
        self._persistent_worker = OrderedWorker("shardpoint-tier-persistent")

    def _replica_targets(self, replicas: int, jump: int | None) -> list[list[int]]:
        world, node_of = self.world_size, self._node_of
        if replicas and len(set(node_of)) == 1:
            if world > 1:
                logger.warning(
                    "tiers: every rank shares one local directory (one node): no peer replicas"
                )
            return [[] for _ in range(world)]
        out = []
        for r in range(world):
            step = jump if jump is not None else node_of.count(node_of[r])
            targets = [(r + k * step) % world for k in range(1, replicas + 1)]
            for t in targets:
                if node_of[t] == node_of[r]:
                    raise InvalidArgumentError(
                        f"replica {t} of rank {r} would be on the same node (local directory "
                        f"{self._local}); choose replication_jump so rank + k*jump is on another node"
                    )
            if len(set(targets)) != len(targets):
                raise InvalidArgumentError(f"rank {r}: replicas {targets} repeat a peer")
            out.append(targets)
        return out

    # -- properties ------------------------------------------------------------------------------
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def local_directory(self) -> str:
        return self._local

    @property
    def checkpoint(self) -> Any:
        return self._checkpoint

    @property
    def replica_targets(self) -> list[int]:
        """The ranks that keep a replica of this rank's local part."""
        return list(self._targets[self.rank])

    @property
    def latest_step(self) -> int | None:
        """The newest step this manager committed or restored (None: neither yet)."""
        return self._latest

    def restore_plan(self) -> RestorePlan | None:
        """The plan of the last :meth:`restore_or_initialize` (per rank: tier, holder, path)."""
        return self._plan

    # -- saving ----------------------------------------------------------------------------------
    def save(
        self, step: int, *, force: bool = False, persistent: bool | None = None
    ) -> SaveFuture | None:
        """Save ``step`` if it is due (``step % local_every == 0``, or ``force``) and return a
        future of the step once committed in the local tier (replicas included); None if not
        due. Every rank must call it with the same arguments. ``persistent``: also (True) or
        never (False) upload this step to the persistent tier; default when
        ``step % persistent_every == 0``. Returns after one copy of the state into host
        memory; an earlier save's error raises here."""
        step = int(step)
        to_persistent = step % self._persistent_every == 0 if persistent is None else persistent
        if not (force or to_persistent or step % self._local_every == 0):
            return None
        self._local_worker.check()
        self._persistent_worker.check()
        token = f"{self._run}.{self._seq}"
        self._seq += 1
        prefix = part_prefix(own_dir(self._local, self.rank), step)
        # a copy of this step number from an abandoned run goes first, its record before all
        if step == self._last_saved:
            self._local_worker.wait()  # the same step again: its earlier save is done first
        self._last_saved = step
        remove_copy(prefix)
        written = self._checkpoint.write(prefix, blocking=False, **self._write_options)
        return self._local_worker.submit(
            lambda: self._commit_local(written, prefix, step, token, bool(to_persistent))
        )

    def _commit_local(
        self, written: Any, prefix: str, step: int, token: str, to_persistent: bool
    ) -> int:
        rank = self.rank
        error: str | None = None
        part: Part | None = None
        try:
            if hasattr(written, "result"):  # a future of the non-blocking write
                written.result()
            fault_point("local:after-part", rank, step)
            # the files mapped (no copy), sent to the replica peers from the page cache;
            # `part` views the mappings
            message: Message
            message, part = map_part_pieces((prefix, rank, step, token, None))
        except _ERRORS as e:
            error = f"rank {rank}: own part: {type(e).__name__}: {e}"
            message = encode_parts([])
        for owner in self._sources:  # stale replicas of this step number, record first
            remove_copy(part_prefix(replica_dir(self._local, rank, owner), step))
        received = self._group.exchange({t: message for t in self._targets[rank]}, self._sources)
        fault_point("replicate:after-send", rank, step)
        held: list[tuple[str, Part]] = []
        for owner, data in received.items():
            try:
                got = [p for p in decode_parts(data, f"rank {owner}") if p.owner == owner]
                if len(got) != 1 or got[0].step != step or got[0].token != token:
                    raise TierError(f"rank {owner} sent no part of step {step} (its save failed)")
                dest = part_prefix(replica_dir(self._local, rank, owner), step)
                write_part(got[0], dest)
                held.append((dest, got[0]))
            except _ERRORS as e:
                error = error or f"rank {rank}: replica of rank {owner}: {type(e).__name__}: {e}"
        fault_point("replicate:after-receive", rank, step)
        outcomes = self._group.all_gather(error)
        failed = [o for o in outcomes if o is not None]
        if failed:
            raise TierError(
                f"step {step} was not committed in the local tier: " + "; ".join(failed)
            )
        assert part is not None
        fault_point("commit:after-agree", rank, step)
        world = self.world_size
        write_record(prefix + COMMIT_SUFFIX, _record(step, token, rank, world, part))
        fault_point("commit:between-markers", rank, step)
        for dest, p in held:
            write_record(dest + COMMIT_SUFFIX, _record(step, token, p.owner, world, p))
        self._latest = step
        if to_persistent:
            with self._pin_lock:
                self._pinned.add(step)
            files = file_list(part)
            self._persistent_worker.submit(lambda: self._upload(prefix, step, token, files))
        self._local_retention(step)
        return step

    def _upload(self, prefix: str, step: int, token: str, files: list[Any]) -> int:
        try:
            upload_step(self._pgroup, self._directory, prefix, step, token, files)
        finally:
            with self._pin_lock:
                self._pinned.discard(step)
        if self.rank == 0:
            apply_retention(self._directory, self.world_size, self._max_to_keep)
        return step

    def _local_retention(self, newest: int) -> None:
        """Per directory of this rank: keep the newest ``local_max_to_keep`` committed steps
        (and anything newer than ``newest``: a save in flight); delete the rest, records first."""
        with self._pin_lock:
            pinned = set(self._pinned)
        committed: dict[str, list[int]] = {}
        for c in committed_copies(self._local, self.rank):
            committed.setdefault(os.path.dirname(c["prefix"]), []).append(int(c["step"]))
        for d, steps in local_steps(self._local, self.rank).items():
            keep = set(sorted(committed.get(d, []))[-self._local_max_to_keep :])
            for s in steps:
                if s < newest and s not in keep and s not in pinned:
                    remove_copy(part_prefix(d, s))

    def wait(self, timeout: float | None = None) -> None:
        """Block until every save committed in the local tier and every due upload committed
        in the persistent tier; raise the first error nobody has seen yet."""
        self._local_worker.wait(timeout)
        self._persistent_worker.wait(timeout)

    def close(self) -> None:
        """Wait for the saves in flight, then stop the background threads and let go of the
        directory locks (another job may then use the directories)."""
        try:
            self.wait()
        finally:
            self._local_worker.close()
            self._persistent_worker.close()
            self._leases.release()

    # -- restoring -------------------------------------------------------------------------------
    def restore_or_initialize(self) -> int | None:
        """Restore the newest step complete in some tier (the same step on every rank) and
        return it, else call ``init_fn`` and return None. A collective.

        Every rank reports the committed copies it holds in one all-gather (rank 0 lists the
        persistent tier's commits meanwhile, in the background; they join the outcome's
        all-gather, and a newer complete step there is restored next); each rank computes the
        same plan (tiers/plan.py): per rank the cheapest copy. Parts held by another node's rank are sent over the group; every
        file is checked against the crc32c of its commit record on the way in, and every value
        again as it is restored. A source that fails its checks is excluded, the ranks agree
        on that, and a new plan is made (an older step if needed): never a mix of steps.
        """
        self.wait()
        # rank 0 lists the persistent tier (object-store requests) in the background while the
        # local and peer tiers are planned and restored from: it decides only when they hold no
        # complete step, or when it holds a newer complete step (then that one is restored)
        listing = (
            _in_background(lambda: persistent_steps(self._directory)) if self.rank == 0 else None
        )
        inventories = self._group.all_gather(committed_copies(self._local, self.rank))
        records: list[dict[str, Any]] | None = None  # None: not known on every rank yet
        excluded: set[tuple[int, int, str, int | None]] = set()
        notes: list[str] = []
        for _ in range(4 * self.world_size + 8):
            plan = self._plan_with(inventories, records or [], excluded)
            plan.excluded = list(notes)
            if plan.step is None:
                if records is None:  # nothing complete nearer: the persistent tier decides
                    records = self._group.all_gather(listing() if listing else None)[0] or []
                    continue
                break
            error = self._execute(plan, records or [])
            listed = listing() if listing is not None and records is None else None
            outcomes = self._group.all_gather([error, listed])
            failures = [o[0] for o in outcomes]
            if records is None:
                records = outcomes[0][1] or []
                newest = self._plan_with(inventories, records, excluded)
                if not any(failures) and (newest.step, newest.token) != (plan.step, plan.token):
                    continue  # the persistent tier holds a newer complete step: that one
            if not any(failures):
                self._plan = plan
                self._latest = plan.step
                logger.info("tiers: rank %d restored %s", self.rank, plan.describe())
                self._drop_newer(plan.step, plan.token or "")
                return plan.step
            for f in failures:
                if f is not None:
                    src = plan.sources[f[0]]
                    excluded.add((plan.step, *src.key))
                    notes.append(f"step {plan.step} rank {f[0]} {src.tier}: {f[1]}")
        self._plan = RestorePlan(None, excluded=notes)
        if notes:
            raise TierError("no tier holds an intact complete step: " + "; ".join(notes))
        if self._init_fn is not None:
            self._init_fn()
        return None

    def _plan_with(
        self,
        inventories: list[Any],
        records: list[dict[str, Any]],
        excluded: set[tuple[int, int, str, int | None]],
    ) -> RestorePlan:
        return choose_plan(
            self.world_size,
            self._node_of,
            inventories,
            records,
            persistent_part_of(self._directory),
            excluded,
        )

    def _execute(self, plan: RestorePlan, records: list[dict[str, Any]]) -> tuple[int, str] | None:
        """This rank's share of ``plan``: send what others fetch from here, get and check its
        own part, restore it. Returns None or (rank, why) when its source failed."""
        assert plan.step is not None and plan.token is not None
        step, token, rank = plan.step, plan.token, self.rank
        mine = plan.source_of(rank)
        sends: dict[int, Message] = {}
        for src in plan.sources:
            if src.tier == "peer" and src.holder == rank:
                # the owner gets its own part, sent from the page cache's pages (mapped)
                try:
                    spec = _committed(src.path, src.owner, step, token)
                    sends[src.owner] = map_part_pieces(spec)[0]
                except _ERRORS as e:
                    logger.warning(
                        "tiers: %s: cannot send it to rank %d: %s", src.path, src.owner, e
                    )
                    sends[src.owner] = encode_parts([])
        sources = [mine.holder] if mine.tier == "peer" and mine.holder is not None else []
        received = self._group.exchange(sends, sources)
        own = part_prefix(own_dir(self._local, rank), step)
        try:
            if mine.tier == "local":
                self._checkpoint.restore(own)  # every value's crc32c checked as it is read
            else:
                part = self._fetch(mine, received, step, token, records)
                remove_copy(own)
                # every file checked against its commit record's crc32c as it is written
                # (so the values need no second check), the local tier refilled
                write_part(part, own, durable=False)
                self._checkpoint.restore(own, verify=False)
                # made durable and committed in the background: training resumes now, and
                # until its record exists the copy does not count (a crash only loses it)
                record = _record(step, token, rank, self.world_size, part)
                self._local_worker.submit(lambda: _commit_refill(part, own, record))
        except _ERRORS as e:
            logger.warning(
                "tiers: rank %d could not restore step %d from %s: %s", rank, step, mine.tier, e
            )
            return (rank, f"{type(e).__name__}: {e}")
        return None

    def _fetch(
        self,
        src: PartSource,
        received: dict[int, Any],
        step: int,
        token: str,
        records: list[dict[str, Any]],
    ) -> Part:
        if src.tier == "peer":
            assert src.holder is not None
            parts = [
                p
                for p in decode_parts(received[src.holder], f"rank {src.holder}")
                if p.owner == src.owner
            ]
            if len(parts) != 1 or parts[0].step != step or parts[0].token != token:
                raise TierError(f"rank {src.holder} could not send its replica of step {step}")
            return parts[0]
        if src.tier == "node":
            path, owner, _, _, files = _committed(src.path, src.owner, step, token)
            return read_part(path, owner, step, token, expect=files)
        rec = next(r for r in records if int(r["step"]) == step and str(r["token"]) == token)
        files = rec.get("parts", {}).get(str(src.owner))
        if not isinstance(files, list):
            raise TierError(f"{src.path}: the persistent commit record lists no files for it")
        return read_part(src.path, src.owner, step, token, expect=files)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (small, JSON-able), in rank order, over the tiers' group: one
        collective for an integration planning what its ranks read after a restore. Waits for
        the local tier's background work first (its collectives use the same group)."""
        self._local_worker.wait()
        return self._group.all_gather(obj)

    def fetch_restored(self, owners: Any) -> dict[int, str]:
        """After :meth:`restore_or_initialize` restored a step (a collective: every rank calls
        it, each naming the ranks whose parts it wants, maybe none): those ranks' parts of the
        restored step, each sent by its owner from its local tier with the crc32c of its commit
        record, every file checked and written under ``<local>/rank-R/fetched-OOOOO/``.
        Returns owner -> prefix of that checkpoint; :meth:`drop_fetched` removes them."""
        from .share import fetch_parts

        plan = self._plan
        if plan is None or plan.step is None or plan.token is None:
            raise TierError("fetch_restored: no step was restored")
        self._local_worker.wait()  # a refilled part's commit record is written there
        return fetch_parts(self._group, self._local, plan.step, plan.token, list(owners))

    def drop_fetched(self) -> None:
        """Remove the parts :meth:`fetch_restored` wrote."""
        from .share import drop_fetched

        drop_fetched(self._local, self.rank)

    def _drop_newer(self, step: int, token: str) -> None:
        """After a restore: this rank's local copies of newer steps (never complete) and of this
        step from another save are removed, so a later save of those numbers starts clean."""
        for d, steps in local_steps(self._local, self.rank).items():
            for s in steps:
                prefix = part_prefix(d, s)
                record = read_record(prefix + COMMIT_SUFFIX)
                if s > step or (s == step and record is not None and record["token"] != token):
                    remove_copy(prefix)


def _write_options(write: Any, compression: str | None, hashed: bool = False) -> dict[str, Any]:
    """``{"compression": compression}`` when ``write`` takes that argument, else nothing (a
    checkpoint object with ``write(prefix, blocking)`` only keeps its own codec); with
    ``hashed``, ``hashed_prefixes=True`` too, which ``write`` must take."""
    try:
        params = list(inspect.signature(write).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: its own codec
        params = []
    takes = lambda name: any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)  # noqa: E731
    out: dict[str, Any] = {"compression": compression} if takes("compression") else {}
    if hashed:
        if not takes("hashed_prefixes"):
            raise InvalidArgumentError(
                "hashed_prefixes=True needs a checkpoint whose write() takes hashed_prefixes"
            )
        out["hashed_prefixes"] = True
    return out


def _in_background(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``fn`` on a thread now; the returned callable waits for its result (or error)."""
    out: futures.Future[Any] = futures.Future()

    def run() -> None:
        try:
            out.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - raised again by the caller's wait
            out.set_exception(e)

    threading.Thread(target=run, name="shardpoint-tier-listing", daemon=True).start()
    return out.result


def _commit_refill(part: Part, prefix: str, record: dict[str, Any]) -> None:
    """fsync a part a restore wrote into the local tier, then write its commit record. A
    failure is logged, not raised: the restore succeeded, the copy just does not count."""
    try:
        sync_part(part, prefix)
        write_record(prefix + COMMIT_SUFFIX, record)
    except OSError as e:
        logger.warning("tiers: %s: the restored copy was not committed locally: %s", prefix, e)


def _committed(prefix: str, owner: int, step: int, token: str) -> PartSpec:
    """A committed local copy to read, its files to carry the crcs of its record."""
    record = read_record(prefix + COMMIT_SUFFIX)
    if record is None or str(record["token"]) != token:
        raise TierError(f"{prefix}: no commit record of this save")
    return (prefix, owner, step, token, record.get("files"))


def _record(step: int, token: str, owner: int, world: int, part: Part) -> dict[str, Any]:
    return {
        "format": 1,
        "step": step,
        "token": token,
        "owner": owner,
        "world": world,
        "files": file_list(part),
    }
