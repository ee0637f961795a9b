"""A rank of tests/scale/test_rank_death.py: a real process that writes its part of numbered
multi-writer saves (``sp.Writer(rank=, world_size=)``) when told on stdin, and, as rank 0, the
coordinator's commit (``sp.merge`` then the state file, as a manager would).

Commands, one per line: ``save STEP [before_data|after_partial]`` (write this rank's values of
checkpoint ``DIR/ckpt-STEP``; the optional word SIGKILLs this process at that point, between
library calls), ``merge STEP`` (rank 0: commit it and name it in the state file). Answers:
``READY``, ``PUBLISHED STEP``, ``COMMITTED STEP``. Kill points inside the library are armed
by ``SHARDPOINT_TEST_KILL_AT`` (rust/src/fault.rs)."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

import shardpoint as sp
from shardpoint.objgraph.checkpoint_state import update_checkpoint_state

RANKS = 4
TENSORS = 4


def values(step: int, rank: int) -> dict[str, np.ndarray]:
    """What rank ``rank`` saves at ``step`` (distinct per step, rank and tensor)."""
    return {
        f"r{rank}/t{i}": np.arange(256, dtype=np.float32) + step * 100 + rank * 10 + i
        for i in range(TENSORS)
    }


def prefix_of(directory: str, step: int) -> str:
    return f"{directory}/ckpt-{step}"


def _die(where: str) -> None:
    print(f"SELFKILL {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    rank, directory = int(sys.argv[1]), sys.argv[2]
    committed: list[str] = []
    print("READY", flush=True)
    for line in sys.stdin:
        cmd, step_s, *rest = line.split()
        step, kill = int(step_s), (rest[0] if rest else "")
        prefix = prefix_of(directory, step)
        if cmd == "save":
            w = sp.Writer(prefix, rank=rank, world_size=RANKS, merge_token=step_s)
            if kill == "before_data":
                _die(kill)
            with w:
                for k, v in values(step, rank).items():
                    w.add(k, v)
            if kill == "after_partial":
                _die(kill)
            print(f"PUBLISHED {step}", flush=True)
        elif cmd == "merge":
            sp.merge(prefix, RANKS, token=step_s)
            committed.append(prefix)
            update_checkpoint_state(directory, prefix, committed)
            print(f"COMMITTED {step}", flush=True)


if __name__ == "__main__":
    main()
