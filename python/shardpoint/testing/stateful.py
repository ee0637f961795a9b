"""``CheckpointManagerMachine``: a Hypothesis state machine that drives a checkpoint manager.

The machine holds an ``sp.Checkpoint`` of a few ``sp.Variable`` s (dtypes and shapes drawn
once per run, every dtype of the format possible) and a *model*: the tree of values saved at
each checkpoint path, the list the manager should show after retention, the latest path, and
which committed checkpoints are on storage. Its rules:

* ``save`` — new values, ``manager.save(checkpoint_number=n)``;
* ``save_async`` — the same with ``blocking=False``; the variables change before ``wait()``
  (the save must have captured the values of its call);
* ``restore`` / ``partial_restore`` — a fresh checkpoint (every array holding other bits than
  expected) restores a committed checkpoint, all of it or some variables;
* ``delete`` — a checkpoint is removed from storage behind the manager's back;
* ``reopen`` — a new manager and checkpoint on the same directory, ``restore_or_initialize()``
  (it must pick the newest intact checkpoint: the latest, then the listed ones, then numbered
  ones found on storage);
* ``failed_save`` — a save that fails part-way through (:meth:`inject_fault`): nothing partial
  may become visible; a save that committed anyway must be complete.

Invariants after every step: ``manager.checkpoints`` equals the model after retention by
``max_to_keep``; ``manager.latest_checkpoint`` and ``sp.latest_checkpoint(directory)`` name
the newest save; every listed checkpoint that was not deleted exists and restores bit for
bit; checkpoints that fell out of retention are gone from storage after the next save without a
fault (a deletion the store refuses is logged and retried by the manager's next save; after a
reopen, one whose retry list could not be written either may linger, as with TensorFlow, until
``shardpoint gc``).

Test your own manager or storage by subclassing and overriding the hooks
(:meth:`make_directory`, :meth:`make_manager`, :meth:`inject_fault`, ...), then
``TestMine = MyMachine.TestCase`` runs it under pytest (set ``TestMine.settings`` for the
number of runs and steps).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

try:
    from hypothesis import HealthCheck, note, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        initialize,
        invariant,
        precondition,
        rule,
        run_state_machine_as_test,
    )
except ImportError as e:  # the kit's assertions work without it; the machine does not
    raise ImportError(
        "shardpoint.testing.stateful needs Hypothesis: pip install 'shardpoint[testing]'"
    ) from e

from .. import storage
from ..objgraph.checkpoint import Checkpoint
from ..objgraph.checkpoint_state import latest_checkpoint
from ..objgraph.manager import CheckpointManager
from ..objgraph.variables import Variable
from ._frameworks import name_of
from .assertions import assert_identical, check
from .strategies import dtypes, shapes, tensors

__all__ = ["CheckpointManagerMachine", "file_size_limit", "run_machine"]

Tree = dict[str, np.ndarray]


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Within the block, writes that would grow a file of this process past ``limit`` bytes
    fail with ``EFBIG`` (``RLIMIT_FSIZE``; ``SIGXFSZ`` ignored): a disk that fills up part-way
    through a save. Main thread only (signal dispositions are set there)."""
    import resource
    import signal

    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    lowered = max(0, int(limit))
    if hard != resource.RLIM_INFINITY:
        lowered = min(lowered, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (lowered, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def _other_bits(tree: Tree) -> Tree:
    """Arrays of the same dtypes and shapes whose every element differs from ``tree``'s."""
    out = {}
    for k, v in tree.items():
        if v.dtype == np.bool_:
            out[k] = ~v
        else:
            w = np.array(v, copy=True)
            w.reshape(-1).view(np.uint8)[...] ^= 0xFF
            out[k] = w
    return out


class CheckpointManagerMachine(RuleBasedStateMachine):
    """Drives a checkpoint manager against a model (module docstring). Class attributes
    narrow or widen the draws: ``variable_dtypes``, ``variable_shapes``, ``max_to_keep``
    (strategies), ``max_variables`` (int)."""

    variable_dtypes: Any = dtypes()
    variable_shapes: Any = shapes(max_dims=2, max_side=5)
    max_to_keep: Any = st.none() | st.integers(1, 3)
    max_variables: int = 3

    def __init__(self) -> None:
        super().__init__()
        self.directory = self.make_directory()
        self.spec: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.keep: int | None = None
        self.manager: Any = None
        self.checkpoint: Any = None
        self.variables: dict[str, Variable] = {}
        self.trees: dict[str, Tree] = {}  # path -> what was last committed there
        self.listed: list[str] = []  # the manager's list after retention, oldest first
        self.latest: str | None = None
        self.on_storage: set[str] = set()  # committed, not deleted, not retained away
        self.maybe_on_storage: set[str] = set()  # retained away, not yet checked gone
        self.may_linger: set[str] = set()  # retained away, deletion hit by a fault, then reopened
        self.deleted: set[str] = set()
        self.next_number = 1

    # -- hooks ------------------------------------------------------------------------------
    def make_directory(self) -> str:
        """A fresh, empty directory (or object-store URL) for one run of the machine."""
        return os.path.join(tempfile.mkdtemp(prefix="sp-manager-machine-"), "run")

    def remove_directory(self, directory: str) -> None:
        """Clean up after one run (the parent of a local :meth:`make_directory`)."""
        if not storage.is_url(directory):
            shutil.rmtree(os.path.dirname(directory), ignore_errors=True)

    def make_manager(self, checkpoint: Any, directory: str, max_to_keep: int | None) -> Any:
        """The manager under test (default ``sp.CheckpointManager``)."""
        return CheckpointManager(checkpoint, directory, max_to_keep=max_to_keep)

    def make_checkpoint(self, variables: dict[str, Variable]) -> Any:
        """The checkpointed object holding ``variables`` (default ``sp.Checkpoint(**vars)``)."""
        return Checkpoint(**variables)

    def checkpoint_path(self, number: int) -> str:
        """Where the manager writes save number ``number``."""
        return f"{self.directory.rstrip('/')}/ckpt-{number}"

    def exists(self, path: str) -> bool:
        return bool(storage.exists(path))

    def delete_checkpoint(self, path: str) -> None:
        """Remove a checkpoint behind the manager's back (a user, a cleanup job)."""
        storage.remove(path)

    def leftovers(self, path: str) -> list[str]:
        """Files of checkpoint ``path`` on storage (shards, temp files, index): none may stay
        after a save that failed before its commit. Local directories only by default (an
        object store keeps a multipart-upload marker until the next commit or ``gc``)."""
        if storage.is_url(path):
            return []
        d, base = os.path.split(path)
        return (
            sorted(n for n in os.listdir(d) if n.startswith(base + ".")) if os.path.isdir(d) else []
        )

    def inject_fault(self, data: Any) -> contextlib.AbstractContextManager[Any] | None:
        """A context in which the next save fails part-way through, or ``None`` when this
        storage has no fault to inject (the rule is then skipped). Default, for local
        directories in the main thread: a file-size limit drawn from 0 to past the size of a
        save (:func:`file_size_limit`), so the failure hits a shard, the index, or nothing."""
        if (
            storage.is_url(self.directory)
            or threading.current_thread() is not threading.main_thread()
        ):
            return None
        size = sum(
            np.dtype(self._np_dtype(d)).itemsize * int(np.prod(s)) for d, s in self.spec.values()
        )
        return file_size_limit(data.draw(st.integers(0, 2 * size + 8192), label="file size limit"))

    def close_manager(self, manager: Any) -> None:
        """Let go of a manager (waits for its saves, releases its directory lock)."""
        with contextlib.suppress(Exception):
            manager.wait()
        close = getattr(manager, "close", None)
        if callable(close):
            close()

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _np_dtype(name: str) -> np.dtype:
        from ..storage.dtypes import numpy_dtype

        return numpy_dtype(name)

    def _draw_tree(self, data: Any) -> Tree:
        return {
            k: data.draw(tensors(dtype=d, shape=s, layout="contiguous"), label=k)
            for k, (d, s) in self.spec.items()
        }

    def _new_checkpoint(self, like: Tree | None) -> tuple[Any, dict[str, Variable]]:
        base = _other_bits(like) if like is not None else None
        variables = {}
        for k, (d, s) in self.spec.items():
            value = base[k] if base is not None else np.zeros(s, self._np_dtype(d))
            variables[k] = Variable(value)
        return self.make_checkpoint(variables), variables

    def _values(self, variables: dict[str, Variable]) -> Tree:
        return {k: v.numpy() for k, v in variables.items()}

    def _assign(self, tree: Tree) -> None:
        for k, v in tree.items():
            self.variables[k].assign(v)

    def _alive(self) -> list[str]:
        return sorted(self.on_storage)

    def _committed(self, path: str, tree: Tree) -> None:
        self.trees[path] = {k: np.array(v, copy=True) for k, v in tree.items()}
        self.deleted.discard(path)
        self.on_storage.add(path)
        if path in self.listed:
            self.listed.remove(path)
        self.listed.append(path)
        self.latest = path
        self.next_number += 1
        while self.keep is not None and len(self.listed) > self.keep:
            gone = self.listed.pop(0)
            self.on_storage.discard(gone)
            self.maybe_on_storage.add(gone)  # checked by the next clean save

    def _check_retention_done(self) -> None:
        """After a save without a fault, what retention dropped is gone from storage."""
        for path in sorted(self.maybe_on_storage):
            if path not in self.on_storage:
                check(not self.exists(path), f"{path} fell out of retention but is still there")
        self.maybe_on_storage.clear()

    def _restore_into_fresh(self, path: str, names: list[str] | None = None) -> None:
        want = self.trees[path]
        names = list(want) if names is None else names
        base = _other_bits({k: want[k] for k in names})
        variables = {k: Variable(base[k]) for k in names}
        ck = self.make_checkpoint(variables)
        status = ck.restore(path)
        if len(names) == len(want):
            status.assert_existing_objects_matched()
        else:
            status.expect_partial()
        assert_identical({k: want[k] for k in names}, self._values(variables))

    def _expected_restore(self) -> str | None:
        """What ``restore_or_initialize`` must pick: the latest, then the listed checkpoints
        newest first, then the other numbered ones on storage, newest first; None if none."""
        maybe = self.maybe_on_storage | self.may_linger
        on = set(self.on_storage) | {p for p in maybe if self.exists(p)}
        order = [p for p in (self.latest, *reversed(self.listed)) if p is not None]
        order += sorted(on, key=lambda p: int(p.rsplit("-", 1)[1]), reverse=True)
        return next((p for p in order if p in on), None)

    # -- rules ------------------------------------------------------------------------------
    @initialize(data=st.data())
    def setup(self, data: Any) -> None:
        self.keep = data.draw(self.max_to_keep, label="max_to_keep")
        n = data.draw(st.integers(1, self.max_variables), label="variables")
        for i in range(n):
            name = name_of(data.draw(self.variable_dtypes, label=f"dtype of v{i}"))
            self.spec[f"v{i}"] = (
                name,
                tuple(data.draw(self.variable_shapes, label=f"shape of v{i}")),
            )
        note(f"directory {self.directory}, max_to_keep={self.keep}, variables {self.spec}")
        self.checkpoint, self.variables = self._new_checkpoint(None)
        self.manager = self.make_manager(self.checkpoint, self.directory, self.keep)

    @rule(data=st.data())
    def save(self, data: Any) -> None:
        tree = self._draw_tree(data)
        self._assign(tree)
        path = self.manager.save(checkpoint_number=self.next_number)
        check(path == self.checkpoint_path(self.next_number), f"save() returned {path}")
        self._committed(path, tree)
        self._check_retention_done()

    @rule(data=st.data())
    def save_async(self, data: Any) -> None:
        tree = self._draw_tree(data)
        self._assign(tree)
        future = self.manager.save(checkpoint_number=self.next_number, blocking=False)
        self._assign(_other_bits(tree))  # the save owns a copy: changing them now is allowed
        self.manager.wait()
        path = future.result()
        check(path == self.checkpoint_path(self.next_number), f"save() returned {path}")
        self._committed(path, tree)
        self._check_retention_done()

    @precondition(lambda self: bool(self.on_storage))
    @rule(data=st.data())
    def restore(self, data: Any) -> None:
        self._restore_into_fresh(data.draw(st.sampled_from(self._alive()), label="restore"))

    @precondition(lambda self: bool(self.on_storage))
    @rule(data=st.data())
    def partial_restore(self, data: Any) -> None:
        path = data.draw(st.sampled_from(self._alive()), label="restore")
        names = data.draw(st.lists(st.sampled_from(sorted(self.spec)), min_size=1, unique=True))
        self._restore_into_fresh(path, names)

    @precondition(lambda self: bool(self.on_storage))
    @rule(data=st.data())
    def delete(self, data: Any) -> None:
        path = data.draw(st.sampled_from(self._alive()), label="delete")
        self.delete_checkpoint(path)
        self.on_storage.discard(path)
        self.deleted.add(path)
        check(not self.exists(path), f"{path} still exists after its deletion")

    @rule()
    def reopen(self) -> None:
        self.close_manager(self.manager)
        # a deletion retried in memory only (its retry list refused by the same fault) is
        # forgotten by the new manager: from here on those may stay on storage
        self.may_linger |= self.maybe_on_storage - self.on_storage
        self.maybe_on_storage -= self.may_linger
        want = self._expected_restore()
        self.checkpoint, self.variables = self._new_checkpoint(self.trees.get(want or ""))
        self.manager = self.make_manager(self.checkpoint, self.directory, self.keep)
        got = self.manager.restore_or_initialize()
        check(got == want, f"restore_or_initialize() picked {got}, expected {want}")
        if want is not None:
            assert_identical(self.trees[want], self._values(self.variables))

    @rule(data=st.data())
    def failed_save(self, data: Any) -> None:
        fault = self.inject_fault(data)
        if fault is None:
            return
        tree = self._draw_tree(data)
        self._assign(tree)
        path = self.checkpoint_path(self.next_number)
        try:
            with fault:
                self.manager.save(checkpoint_number=self.next_number)
        except Exception as e:  # noqa: BLE001 - any error: what matters is what is visible
            note(f"injected fault: {type(e).__name__}: {e}")
        else:
            # committed; the fault may have hit retention's deletions instead, which the
            # manager logs and retries at its next save: checked by the next clean save
            self._committed(path, tree)
            return
        if path in self.manager.checkpoints:
            self._committed(path, tree)  # failed after its commit: listed, must be complete
        elif self.exists(path):
            self.trees[path] = {k: np.array(v, copy=True) for k, v in tree.items()}
            self.on_storage.add(path)  # committed, not listed: restorable, never listed
            self.deleted.discard(path)
            self.next_number += 1
        else:
            left = self.leftovers(path)
            check(not left, f"a save that failed before its commit left {left}")

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def listed_after_retention(self) -> None:
        if self.manager is not None:
            check(
                list(self.manager.checkpoints) == self.listed,
                f"manager lists {self.manager.checkpoints}, expected {self.listed}",
            )

    @invariant()
    def latest_is_newest(self) -> None:
        if self.manager is not None:
            check(
                self.manager.latest_checkpoint == self.latest,
                f"manager.latest_checkpoint is {self.manager.latest_checkpoint}, expected {self.latest}",
            )
            # the state file's answer is None once the checkpoint it names is gone (TF's rule)
            gone = self.latest in self.deleted
            state = latest_checkpoint(self.directory)
            check(state == (None if gone else self.latest), f"sp.latest_checkpoint() is {state}")

    @invariant()
    def listed_checkpoints_restore_identically(self) -> None:
        for path in self.listed:
            if path in self.deleted:
                continue
            check(self.exists(path), f"listed checkpoint {path} does not exist")
            self._restore_into_fresh(path)

    def teardown(self) -> None:
        if self.manager is not None:
            self.close_manager(self.manager)
        self.remove_directory(self.directory)


def run_machine(machine: type[CheckpointManagerMachine], *, runs: int, steps: int) -> None:
    """Run ``machine`` ``runs`` times for up to ``steps`` steps each (no deadline: saves do
    I/O), raising what it finds: for suites that run a machine inside a test function."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=runs,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
