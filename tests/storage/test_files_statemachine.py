"""Dict-shadow state machine over the file API: a Python dict models the committed checkpoint,
a second one the values staged in an open Writer. Rules save, overwrite, delete keys, commit
(save_file or a streaming Writer), abort, reopen, read and remove; after every step what
``sp.load_file`` returns must equal the shadow, and readers opened earlier keep seeing the
checkpoint they opened."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shardpoint as sp
from shardpoint.testing import assert_identical

KEYS = st.sampled_from(["a", "b", "net/w", "net/b", "é/ü", "opt/step", "z" * 40, "\U0001f600"])
ARRAYS = st.builds(
    lambda dt, n, seed, comp: (
        (np.random.default_rng(seed).standard_normal(n) * 10).astype(dt)
        if not comp
        else np.repeat(np.arange(n // 64 + 1, dtype=dt), 64)[:n]
    ),
    st.sampled_from(["float32", "int16", "uint8", "float64", "complex64"]),
    st.sampled_from([0, 1, 5, 700, 3000]),
    st.integers(0, 1000),
    st.booleans(),
)
SCALARS = st.builds(lambda x: np.array(x, dtype=np.float64), st.floats(allow_nan=False))  # 0-d
VALUES = st.one_of(
    ARRAYS, SCALARS, st.integers(-(10**30), 10**30), st.text(max_size=10), st.binary(max_size=10)
)


class FileShadow(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="sp-state-")
        self.prefix = os.path.join(self.dir, "ck")
        self.committed: dict | None = None  # None: no checkpoint at the prefix
        self.staged: dict = {}  # the next save's contents
        self.writer: sp.Writer | None = None
        self.writer_vals: dict = {}
        # A commit or remove at P while a Writer is open unlinks that Writer's temp shards
        # (FORMAT.md §8 cleanup of transient files): its commit may then fail, but must never
        # damage the checkpoint at P.
        self.writer_clobbered = False
        self.readers: list[tuple[sp.Reader, dict]] = []

    def teardown(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        for r, _ in self.readers:
            r.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- staging a whole-checkpoint save -------------------------------------------------
    @rule(key=KEYS, value=VALUES)
    def stage_put(self, key, value) -> None:
        self.staged[key] = value

    @rule(key=KEYS)
    def stage_delete(self, key) -> None:
        self.staged.pop(key, None)

    @rule(compression=st.sampled_from(["none", "zstd", "zstd-plain"]), shards=st.integers(1, 3))
    def commit_save_file(self, compression, shards) -> None:
        sp.save_file(
            self.staged,
            self.prefix,
            compression=compression,
            shards=shards,
            durable=False,
            chunk_bytes=4096,
        )
        self.committed = dict(self.staged)
        self.writer_clobbered = self.writer is not None

    # ---- streaming Writer ----------------------------------------------------------------
    @precondition(lambda self: self.writer is None)
    @rule(compression=st.sampled_from(["none", "zstd"]))
    def writer_open(self, compression) -> None:
        self.writer = sp.Writer(self.prefix, compression=compression, durable=False, shards=2)
        self.writer_vals = {}
        self.writer_clobbered = False

    @precondition(lambda self: self.writer is not None)
    @rule(key=KEYS, value=VALUES)
    def writer_add(self, key, value) -> None:
        if key in self.writer_vals:
            try:
                self.writer.add(key, value)
            except sp.DuplicateKeyError:
                return
            raise AssertionError("duplicate key accepted by Writer.add")
        self.writer.add(key, value)
        self.writer_vals[key] = value

    @precondition(lambda self: self.writer is not None)
    @rule()
    def writer_commit(self) -> None:
        w, self.writer = self.writer, None
        if self.writer_clobbered:
            try:
                w.commit()
            except sp.CheckpointError:
                return  # the checkpoint at P is checked by the invariants
        else:
            w.commit()
        self.committed = dict(self.writer_vals)
        self.staged = dict(self.writer_vals)

    @precondition(lambda self: self.writer is not None)
    @rule()
    def writer_abort(self) -> None:
        self.writer.abort()
        self.writer = None

    # ---- readers, removal ----------------------------------------------------------------
    @precondition(lambda self: self.committed is not None and len(self.readers) < 3)
    @rule()
    def open_reader(self) -> None:
        self.readers.append((sp.open(self.prefix), dict(self.committed)))

    @precondition(lambda self: self.readers)
    @rule(i=st.integers(0, 2), key=KEYS)
    def read_from_reader(self, i, key) -> None:
        r, snapshot = self.readers[i % len(self.readers)]
        if key in snapshot:
            assert_identical(snapshot[key], r[key])
        else:
            assert key not in r and r.get(key, "missing") == "missing"

    @precondition(lambda self: self.readers)
    @rule(i=st.integers(0, 2))
    def close_reader(self, i) -> None:
        r, snapshot = self.readers.pop(i % len(self.readers))
        assert_identical(snapshot, r.load())
        r.close()

    @precondition(lambda self: self.committed is not None)
    @rule()
    def remove(self) -> None:
        sp.remove(self.prefix)
        self.committed = None
        self.writer_clobbered = self.writer is not None

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    def load_equals_shadow(self) -> None:
        if self.committed is None:
            assert not sp.exists(self.prefix)
            return
        assert_identical(self.committed, sp.load_file(self.prefix))

    @invariant()
    def no_leftover_temp_files(self) -> None:
        if self.writer is None:
            names = os.listdir(self.dir)
            assert not [n for n in names if ".tmp-" in n or ".part-" in n], names


FileShadow.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFileShadow = FileShadow.TestCase
