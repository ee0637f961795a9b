"""``Checkpoint``: save and restore an object graph (TF's ``tf.train.Checkpoint`` semantics)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import NotFoundError
from ..storage.async_save import AsyncSaver, StagingBuffers
from . import storage_io
from .checkpoint_state import update_checkpoint_state
from .errors import DuplicateDependencyError, NotTrackableError
from .load_status import (
    CheckpointLoadStatus,
    InitializationOnlyStatus,
    NameBasedLoadStatus,
    restore_by_name,
)
from .module import Module
from .naming import OBJECT_GRAPH_KEY, encode_object_graph, parse_object_graph, serialize
from .restore import RestoreCoordinator
from .trackable import Trackable, ValueSpec, as_trackable
from .variables import Variable
from .wrappers import wrap_value

__all__ = ["Checkpoint"]

_SAVE_COUNTER = "save_counter"


def _deref(name: str, ref: weakref.ref) -> Any:
    target = ref()
    if target is None:
        raise ValueError(f"`Checkpoint` was given a dead weak reference as {name}")
    return target


def _require_trackable(name: str, value: Any) -> Trackable:
    tracked = as_trackable(value)
    if tracked is None:
        raise NotTrackableError(
            f"`Checkpoint` was expecting {name} to be a trackable object (a Variable, Module or "
            "other Trackable, a list/dict of them, an object with state_dict()/"
            f"load_state_dict(), or an object with a registered adapter), got {value!r}. Plain "
            "numbers, strings, sets and tuples without trackables are not saved; wrap them in a "
            "Variable or register an adapter with register_trackable_adapter()."
        )
    return tracked


class Checkpoint(Module):
    """Groups trackable objects and saves/restores them.

    ``Checkpoint(root=None, **kwargs)``: each keyword becomes a root-level dependency named by
    the keyword (inserted in sorted order); with ``root`` the root's own dependencies are
    top-level too (no ``root/`` prefix). ``save_counter`` (int64) is created on the first
    ``save()``/``restore()`` or on first access and is listed after the keywords.

    As in TensorFlow, ``root`` may be a ``weakref.ref`` to the root object: the Checkpoint then
    holds it weakly (saving after it was collected raises ``ValueError``). A keyword value that
    is a ``weakref.ref`` is dereferenced and tracked like the object itself.
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        self._sp_root_strong: Trackable | None = None
        self._sp_root_weak: weakref.ref | None = None
        self._sp_save_counter: Variable | None = None
        if root is not None:
            if isinstance(root, weakref.ref):
                target = _deref("root", root)
                _require_trackable("root", wrap_value(target))
                self._sp_root_weak = root
            else:
                root = wrap_value(root)
                self._sp_root_strong = _require_trackable("root", root)
        for name in sorted(kwargs):
            raw = kwargs[name]
            if isinstance(raw, weakref.ref):
                raw = _deref(name, raw)
            value = wrap_value(raw)
            tracked = _require_trackable(name, value)
            if self._sp_root_object is not None:
                existing = self._sp_root_object._sp_lookup(name)
                if existing is tracked:
                    object.__setattr__(self, name, value)
                    continue
                if existing is not None:
                    raise DuplicateDependencyError(
                        f"Cannot create a Checkpoint with keyword argument {name} if "
                        f"root.{name} already exists (and is a different object)."
                    )
            setattr(self, name, value)

    # -- root delegation ---------------------------------------------------------------------
    @property
    def _sp_root_object(self) -> Trackable | None:
        if self._sp_root_weak is None:
            return self._sp_root_strong
        target = self._sp_root_weak()
        if target is None:
            raise ValueError(
                "The root object of this Checkpoint was passed as a weak reference and has "
                "been garbage-collected; keep a strong reference to it while checkpointing."
            )
        return as_trackable(target)

    @property
    def root(self) -> Trackable | None:
        """The ``root`` object, if one was given."""
        return self._sp_root_object

    def _sp_children(self) -> Mapping[str, Trackable]:
        own = super()._sp_children()
        if self._sp_root_object is None:
            return own
        merged = dict(self._sp_root_object._sp_children())
        for name, child in own.items():
            merged.pop(name, None)
            merged[name] = child
        return merged

    def _sp_lookup(self, name: str) -> Trackable | None:
        found = super()._sp_lookup(name)
        if found is None and self._sp_root_object is not None:
            found = self._sp_root_object._sp_lookup(name)
        return found

    def _sp_deferral_host(self, name: str) -> Trackable:
        # a missing top-level dependency will appear on the root object (root.x = ...), except
        # save_counter which the Checkpoint itself creates
        if self._sp_root_object is not None and name != _SAVE_COUNTER:
            return self._sp_root_object
        return self

    @property
    def _sp_open_attributes(self) -> bool:  # type: ignore[override]  # class flag, per-root here
        root = self._sp_root_object
        return bool(root is not None and root._sp_open_attributes)

    def _sp_values(self) -> Mapping[str, Any]:
        root = self._sp_root_object
        return {} if root is None else root._sp_values()

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        root = self._sp_root_object
        return {} if root is None else root._sp_value_specs()

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        if self._sp_root_object is not None:
            self._sp_root_object._sp_restore_values(values)

    # -- save counter --------------------------------------------------------------------------
    @property
    def save_counter(self) -> Variable:
        """Number of ``save()`` calls so far; reading it creates it (value 0) if absent."""
        if self._sp_save_counter is None:
            counter = Variable(np.int64(0), name=_SAVE_COUNTER, trainable=False)
            self._sp_save_counter = counter
            # tracking runs any restore waiting for "save_counter" (restore-on-create)
            self._sp_track(_SAVE_COUNTER, counter)
        return self._sp_save_counter

    # -- writing -------------------------------------------------------------------------------
    def write(
        self,
        file_prefix: str | os.PathLike,
        options: Any = None,
        *,
        blocking: bool = True,
        incremental: bool = False,
        digest: str | None = None,
        compression: str | None = "zstd",
        hashed_prefixes: bool = False,
    ) -> Any:
        """Write exactly at ``file_prefix``; no numbering, no state file, counter untouched.

        Returns the prefix, or with ``blocking=False`` (or ``options`` with
        ``experimental_enable_async_checkpoint`` set, TensorFlow's spelling) a
        :class:`~shardpoint.storage.async_save.SaveFuture` whose result is the prefix: every value is
        copied into reusable host buffers before the call returns, and the write runs in the
        background (see :meth:`wait`, :attr:`max_in_flight`). ``incremental``: values unchanged
        since this object's previous committed save are not written again (FORMAT.md §8.1).
        ``digest``: ``"sha256"``/``"blake3"`` records strong digests of the files
        (``sp.save_file``'s option; checked by ``verify(strong=True)``). ``compression``:
        ``sp.save_file``'s (``None``: stored as is, restored without decoding; the tiered
        manager's local tier uses that). ``hashed_prefixes``: the shards at
        ``file_prefix/HH/data-…`` (``sp.save_file``'s; FORMAT.md §3.1.1).
        """
        prefix = os.fspath(file_prefix)
        return self._write(
            prefix,
            _blocking(blocking, options),
            incremental,
            then=None,
            digest=digest,
            compression=compression,
            hashed_prefixes=hashed_prefixes,
        )

    def save(
        self,
        file_prefix: str | os.PathLike,
        options: Any = None,
        *,
        blocking: bool = True,
        incremental: bool = False,
        digest: str | None = None,
    ) -> Any:
        """Increment ``save_counter``, write ``<prefix>-<n>``, record it in the state file.

        ``blocking``/``incremental``/``digest`` as in :meth:`write`; asynchronously, the counter is
        incremented and the path fixed in the call, the state file is updated in the
        background after the commit (so ``latest_checkpoint`` only names committed saves)."""
        prefix = os.fspath(file_prefix)
        self._sp_check()  # an earlier failure raises before the counter moves
        counter = self.save_counter
        counter.assign_add(1)
        path = f"{prefix}-{int(counter)}"
        try:
            return self._write(
                path,
                _blocking(blocking, options),
                incremental,
                then=lambda: update_checkpoint_state(storage_io.dirname(path), path),
                digest=digest,
            )
        except BaseException:
            uncount_failed_save(counter, path)
            raise

    def _write(
        self,
        path: str,
        blocking: bool,
        incremental: bool,
        then: Callable[[], None] | None,
        base: Callable[[], str | None] | None = None,
        digest: str | None = None,
        delta: int | None = None,
        compression: str | None = "zstd",
        hashed_prefixes: bool = False,
    ) -> Any:
        """Write at ``path`` (then run ``then``): now, or through this object's saver.
        ``base()`` names the checkpoint an incremental save re-uses (default: this object's
        previous committed save); asynchronously it is asked just before the write. ``delta``: a
        delta checkpoint against ``base()`` with chains of at most that many links (blocking
        saves only). ``hashed_prefixes``: ``sp.save_file``'s (FORMAT.md §3.1.1)."""
        if base is None:
            base = lambda: self._sp_last_written  # noqa: E731
        values, document = serialize(self)
        graph = encode_object_graph(document)
        saver = self._sp_saver
        if blocking:
            if saver is not None and saver.in_flight:
                saver.wait()  # keep call order: earlier asynchronous saves commit first
            elif saver is not None:
                saver.check()
            storage_io.write_checkpoint(
                path, values, graph, incremental=incremental, base=base(), digest=digest,
                delta=delta, compression=compression, hashed_prefixes=hashed_prefixes,
            )  # fmt: skip
            object.__setattr__(self, "_sp_last_written", path)
            if then is not None:
                then()
            return path
        if delta is not None:
            raise ValueError("delta checkpoints are written by blocking saves only")

        def committed() -> None:
            object.__setattr__(self, "_sp_last_written", path)
            if then is not None:
                then()

        stage = storage_io.stage_checkpoint(
            path,
            values,
            graph,
            incremental=incremental,
            base=base,
            then=committed,
            digest=digest,
            compression=compression,
            hashed_prefixes=hashed_prefixes,
        )
        fut = self._saver().submit(_returning(stage, path))
        return fut

    # -- asynchronous saves ----------------------------------------------------------------------
    _sp_saver: AsyncSaver | None = None
    _sp_last_written: str | None = None
    _sp_max_in_flight: int = 1

    def _saver(self) -> AsyncSaver:
        if self._sp_saver is None:
            saver = AsyncSaver(self._sp_max_in_flight, name="shardpoint-checkpoint")
            object.__setattr__(self, "_sp_saver", saver)
            return saver
        return self._sp_saver

    @property
    def max_in_flight(self) -> int:
        """Asynchronous saves of this object staged or being written at once (default 1: a
        further save waits in its call for the previous one). Each holds one copy of the
        saved values in host memory."""
        return self._sp_max_in_flight

    @max_in_flight.setter
    def max_in_flight(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_in_flight must be a positive integer, got {n!r}")
        if self._sp_saver is not None:
            self._sp_saver.wait()
        object.__setattr__(self, "_sp_max_in_flight", n)
        object.__setattr__(self, "_sp_saver", None)

    def _sp_check(self) -> None:
        """Raise the unobserved error of an earlier asynchronous save, if any."""
        if self._sp_saver is not None:
            self._sp_saver.check()

    def wait(self, timeout: float | None = None) -> None:
        """Block until every asynchronous save of this object has committed; raise the first
        error nobody has seen yet (on a future's ``result()`` or a later save)."""
        if self._sp_saver is not None:
            self._sp_saver.wait(timeout)

    # -- reading -------------------------------------------------------------------------------
    def read(
        self, save_path: str | os.PathLike, options: Any = None, *, verify: bool = True
    ) -> CheckpointLoadStatus | NameBasedLoadStatus:
        """Restore without save-counter handling (never creates ``save_counter``)."""
        return self._read(os.fspath(save_path), hint=False, verify=verify)

    def restore(
        self, save_path: str | os.PathLike | None, options: Any = None, *, verify: bool = True
    ) -> CheckpointLoadStatus | NameBasedLoadStatus | InitializationOnlyStatus:
        """Restore from ``save_path`` (None: nothing, an initialization-only status).

        Values of existing objects are assigned now; values whose objects do not exist yet are
        restored when those objects are attached. ``save_counter`` is created afterwards, so
        numbering continues from a ``save()``d checkpoint. Every value's crc32c is checked
        before it is assigned (a damaged one raises ``ChecksumMismatchError``);
        ``verify=False`` is the explicit opt-out.
        """
        if save_path is None:
            return InitializationOnlyStatus()
        status = self._read(os.fspath(save_path), hint=True, verify=verify)
        _ = self.save_counter  # create it; restores it if the checkpoint has one
        return status

    def _read(
        self, path: str, hint: bool, verify: bool = True
    ) -> CheckpointLoadStatus | NameBasedLoadStatus:
        try:
            reader = storage_io.open_reader(path, verify)
        except FileNotFoundError as exc:
            if storage_io.checkpoint_exists(path):
                raise  # the index is there: the error names the missing shard
            raise NotFoundError(_not_found_message(path, hint)) from exc
        if OBJECT_GRAPH_KEY not in reader:
            try:
                return restore_by_name(reader, self)
            finally:
                reader.close()  # no deferred restore in this mode: done with the files
        document = parse_object_graph(reader[OBJECT_GRAPH_KEY])
        coordinator = RestoreCoordinator(
            reader, document, path, self, lambda p: storage_io.open_reader(p, verify)
        )
        status = CheckpointLoadStatus(coordinator, self)
        coordinator.bind_and_restore(0, self)
        return status

    def __repr__(self) -> str:
        names = ", ".join(self._sp_children())
        return f"<sp.Checkpoint ({names})>"


def uncount_failed_save(counter: Variable, path: str) -> None:
    """A save that raised before committing ``path`` (an unsaveable object, a full disk) gives
    its number back, so the next save does not skip one; a committed one keeps it."""
    try:
        committed = storage_io.checkpoint_exists(path)
    except Exception:  # noqa: BLE001 - cannot tell: keep the number (never reuse a committed one)
        return
    if not committed:
        counter.assign_add(-1)


def _blocking(blocking: bool, options: Any) -> bool:
    """``blocking``, unless TensorFlow-style ``options`` ask for an asynchronous save."""
    return bool(blocking) and not getattr(options, "experimental_enable_async_checkpoint", False)


def _returning(
    stage: Callable[[StagingBuffers], Callable[[], None]], result: str
) -> Callable[[StagingBuffers], Callable[[], str]]:
    """A ``stage`` step whose background writer returns ``result`` (the checkpoint path)."""

    def staged(bufs: StagingBuffers) -> Callable[[], str]:
        write = stage(bufs)

        def run() -> str:
            write()
            return result

        return run

    return staged


def _not_found_message(path: str, hint: bool) -> str:
    message = f"No checkpoint found at {path} ({path}.index does not exist)."
    if hint:
        message = f"Error when restoring from checkpoint at {path}: {message}"
        if not storage_io.is_url(path) and os.path.isdir(path):
            message += (
                " The path is a directory; pass a checkpoint prefix such as "
                "sp.latest_checkpoint(directory)."
            )
        else:
            message += (
                " Please double-check that the path is correct. You may be missing the "
                "checkpoint suffix (e.g. the '-1' in 'path/to/ckpt-1')."
            )
    return message
