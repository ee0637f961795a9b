"""The child process of the crash-consistency tests: a training-like save loop to be SIGKILLed.

    python -m reliability_helpers.crash_child MODE DIRECTORY [MAX_SAVES]

MODE is ``manager`` (``CheckpointManager``, max_to_keep=3), ``async`` (the same with
``save(blocking=False)``, values scrambled right after the call), ``incremental`` (``async`` with
``incremental=True`` and a frozen 4.5 MB value whose shard consecutive checkpoints share by hard
link, so rotation deletes files a newer checkpoint still uses), ``checkpoint`` (plain
``Checkpoint.save``, which also writes the state file) or ``merge`` (two ranks of a
multi-writer ``sp.Writer`` save at the fixed prefix ``DIRECTORY/mw``, then ``sp.merge``). The
child first restores the latest checkpoint (so a restarted child continues the numbering, as a
real job would), prints ``READY <pid> <step>``, then saves steps ``step+1, step+2, ...``,
printing ``BEGIN s`` before and ``DONE s`` after each save (flushed), up to MAX_SAVES saves.

The state of step ``s`` is a pure function of ``s`` (:func:`state_for`), so the parent can tell
whether what it finds on disk after a kill is exactly one of the states saved.

Test-only slow-down and kill hooks (never in library code): the child monkeypatches library
functions with wrappers that, at named points, sleep (``SP_CRASH_SLOW="point=seconds,..."``,
``*`` for every point) or SIGKILL themselves at the n-th hit of a point
(``SP_CRASH_SELFKILL="point:n"``). Points: ``save_file.before/after`` (around the Rust save),
``state.before/tmp_written/after`` (around and inside the state-file update: after the temp
file is written and fsynced, before its rename), ``remove.before/after`` (around the manager's
deletion of an old checkpoint), ``merge.rank0`` (rank 0 committed its partial index, rank 1
not yet), ``merge.partials`` (both partials committed, merge not yet).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import numpy as np

W_SHAPE = (300, 1000)  # 1.2 MB of float32: two zstd chunks at the default chunk size
MW_PREFIX = "mw"
#: Modes that save through a CheckpointManager (max_to_keep=3).
MANAGED = ("manager", "async", "incremental")


def state_for(step: int) -> dict[str, np.ndarray]:
    """The values saved at ``step`` (deterministic, compressible, different for every step)."""
    w = (np.arange(W_SHAPE[0] * W_SHAPE[1], dtype=np.float32) % 251) * 0.5 + np.float32(step)
    return {"w": w.reshape(W_SHAPE), "b": np.full(16, step, dtype=np.int64)}


def step_of(values: dict[str, Any]) -> int | None:
    """The step whose state ``values`` is, or None when the values are mixed or partial.
    ``values`` are plain (``w``, ``b``) or object-graph keys (``w/.ATTRIBUTES/...``)."""
    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    values = {k.removesuffix(suffix): v for k, v in values.items()}
    if "w" not in values or "b" not in values:
        return None
    b = np.asarray(values["b"])
    if b.shape != (16,) or not (b == b[0]).all():
        return None
    s = int(b[0])
    expect = state_for(s)
    w = np.asarray(values["w"])
    if w.shape != W_SHAPE or not np.array_equal(w, expect["w"]):
        return None
    return s


class Hooks:
    """Named points where the child sleeps or kills itself (configured by environment)."""

    def __init__(self) -> None:
        self.slow: dict[str, float] = {}
        for part in filter(None, os.environ.get("SP_CRASH_SLOW", "").split(",")):
            name, _, sec = part.partition("=")
            self.slow[name] = float(sec)
        kill = os.environ.get("SP_CRASH_SELFKILL", "")
        self.kill_point, _, n = kill.partition(":")
        self.kill_at = int(n or 1)
        self.hits: dict[str, int] = {}

    def __call__(self, point: str) -> None:
        self.hits[point] = self.hits.get(point, 0) + 1
        if point == self.kill_point and self.hits[point] == self.kill_at:
            print(f"SELFKILL {point}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        delay = self.slow.get(point, self.slow.get("*", 0.0))
        if delay:
            time.sleep(delay)


def install_hooks(hooks: Hooks) -> None:
    """Wrap the library functions a save goes through (in this process only)."""
    import shardpoint.objgraph.checkpoint_state as checkpoint_state
    from shardpoint import storage
    from shardpoint.objgraph import storage_io

    real_save = storage.save_file

    def save_file(*a: Any, **kw: Any) -> None:
        hooks("save_file.before")
        real_save(*a, **kw)
        hooks("save_file.after")

    storage.save_file = save_file  # storage_io looks it up on every call (storage.save_file)

    real_write_state = checkpoint_state.write_checkpoint_state
    real_fsync = os.fsync
    in_state = [False]

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if in_state[0]:
            in_state[0] = False  # the first fsync inside the update is the temp file's
            hooks("state.tmp_written")

    os.fsync = fsync

    def write_checkpoint_state(directory: Any, state: Any) -> None:
        hooks("state.before")
        in_state[0] = True
        try:
            real_write_state(directory, state)
        finally:
            in_state[0] = False
        hooks("state.after")

    checkpoint_state.write_checkpoint_state = write_checkpoint_state

    real_remove = storage_io.remove_checkpoint

    def remove_checkpoint(prefix: str) -> None:
        hooks("remove.before")
        real_remove(prefix)
        hooks("remove.after")

    storage_io.remove_checkpoint = remove_checkpoint


#: Incremental mode: a frozen value big enough (>= 4 MiB) for a shard of its own, shared by
#: hard link between consecutive checkpoints, so rotation deletes files newer ones still use.
FROZEN_SHAPE = (1024, 1100)


def frozen_value() -> np.ndarray:
    return (np.arange(FROZEN_SHAPE[0] * FROZEN_SHAPE[1], dtype=np.float32) % 97).reshape(
        FROZEN_SHAPE
    )


def make_checkpoint(mode: str = "manager") -> Any:
    import shardpoint as sp

    init = state_for(0)
    ck = sp.Checkpoint(w=sp.Variable(init["w"]), b=sp.Variable(init["b"]))
    if mode == "incremental":
        ck.frozen = sp.Variable(frozen_value())
    return ck


def make_manager(mode: str, ckpt: Any, directory: str) -> Any:
    """The manager of the managed modes: plain, asynchronous saves, incremental saves."""
    import shardpoint as sp

    return sp.CheckpointManager(ckpt, directory, max_to_keep=3, incremental=mode == "incremental")


def manager_save(mode: str, mgr: Any, ckpt: Any, step: int) -> None:
    """One save of ``step`` as the mode does it. Asynchronous modes scramble the values right
    after the call (a training step): the checkpoint must still hold exactly ``step``."""
    if mode in ("async", "incremental"):
        fut = mgr.save(blocking=False)
        assign(ckpt, step + 1000)
        fut.result()
        assign(ckpt, step)
    else:
        mgr.save()


def assign(ckpt: Any, step: int) -> None:
    vals = state_for(step)
    ckpt.w.assign(vals["w"])
    ckpt.b.assign(vals["b"])


def merge_save(directory: str, step: int, hooks: Hooks) -> None:
    """One multi-writer save of ``step``: two ranks, then the merge."""
    import shardpoint as sp

    prefix = os.path.join(directory, MW_PREFIX)
    vals = state_for(step)
    # rank 0 writes w, rank 1 writes b: a mixed checkpoint would pair w and b of two steps
    for rank, key in ((0, "w"), (1, "b")):
        w = sp.Writer(prefix, rank=rank, world_size=2)
        w.add(key, vals[key])
        w.commit()
        if rank == 0:
            hooks("merge.rank0")
    hooks("merge.partials")
    sp.merge(prefix, 2)


def merged_step(directory: str) -> int | None:
    """Step of the committed multi-writer checkpoint, or None when there is none."""
    import shardpoint as sp

    prefix = os.path.join(directory, MW_PREFIX)
    if not sp.exists(prefix):
        return None
    with sp.open(prefix) as r:
        r.verify()
        s = step_of(r.load())
    if s is None:
        raise AssertionError(f"{prefix}: mixed or partial multi-writer checkpoint")
    return s


def main(argv: list[str]) -> None:
    mode, directory = argv[0], argv[1]
    max_saves = int(argv[2]) if len(argv) > 2 else 1 << 30
    import shardpoint as sp

    hooks = Hooks()
    install_hooks(hooks)
    if mode == "merge":
        step = merged_step(directory) or 0
    else:
        ckpt = make_checkpoint(mode)
        if mode in MANAGED:
            mgr = make_manager(mode, ckpt, directory)
            mgr.restore_or_initialize()
        else:
            latest = sp.latest_checkpoint(directory)
            if latest is not None:
                ckpt.restore(latest).assert_consumed()
        step = int(ckpt.save_counter)
    print(f"READY {os.getpid()} {step}", flush=True)
    for _ in range(max_saves):
        step += 1
        print(f"BEGIN {step}", flush=True)
        if mode == "merge":
            merge_save(directory, step, hooks)
        else:
            assign(ckpt, step)
            if mode in MANAGED:
                manager_save(mode, mgr, ckpt, step)
            else:
                ckpt.save(os.path.join(directory, "ckpt"))
        print(f"DONE {step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
