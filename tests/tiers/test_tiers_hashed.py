"""The tiered manager with ``hashed_prefixes=True`` (FORMAT.md §3.1.1): parts whose shards are
``ckpt-S/HH/data-…`` are copied to the persistent tier under the same names, restored from it
by a later process, and swept by retention without leaving hashed directories behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp
from reference_crc import crc32c
from shardpoint.errors import CorruptCheckpointError
from shardpoint.tiers.parts import Part, PartFile, decode_parts, encode_parts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MANAGER = """
import numpy as np, shardpoint as sp
w = sp.Variable(np.zeros(5000, dtype=np.float32))
step = sp.Variable(np.int64(-1))
m = sp.TieredCheckpointManager(
    sp.Checkpoint(w=w, step=step), {persistent!r}, local_directory={local!r},
    local_every=1, persistent_every=2, max_to_keep=1, local_max_to_keep=1,
    hashed_prefixes=True,
)
"""


def _files(d) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def _hh(s: int, n: int) -> str:
    return f"{crc32c(f'.data-{s:05d}-of-{n:05d}'.encode()) & 0xFF:02x}"


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_hashed_parts_round_trip_through_the_persistent_tier(tmp_path) -> None:
    local, persistent = str(tmp_path / "local"), str(tmp_path / "persistent")
    w = sp.Variable(np.zeros(5000, dtype=np.float32))
    step = sp.Variable(np.int64(-1))
    m = sp.TieredCheckpointManager(
        sp.Checkpoint(w=w, step=step), persistent, local_directory=local,
        local_every=1, persistent_every=2, max_to_keep=1, local_max_to_keep=1,
        hashed_prefixes=True,
    )  # fmt: skip
    for s in range(1, 5):
        w.assign(np.arange(5000, dtype=np.float32) * 3 + s)
        step.assign(np.int64(s))
        m.save(s)
    m.wait()
    m.close()
    shard = f"{_hh(0, 1)}/data-00000-of-00001"
    # retention kept one step per tier; the swept steps left no file and no directory
    assert [f for f in _files(persistent) if "data-" in f] == [f"ckpt-4/part-00000/{shard}"]
    own_dir = os.path.join(local, "rank-00000", "own")
    own = _files(own_dir)
    # the newest step, and the one before it while its upload pinned it (retention runs on
    # the next save): each step's shard under its hashed directory, nothing else
    steps = sorted(n[: -len(".index")] for n in os.listdir(own_dir) if n.endswith(".index"))
    assert steps[-1] == "ckpt-4" and len(steps) <= 2, own
    assert [f for f in own if "data-" in f] == [f"{s}/{shard}" for s in steps], own
    assert (
        sorted(d for d in os.listdir(own_dir) if os.path.isdir(os.path.join(own_dir, d))) == steps
    )
    shutil.rmtree(local)  # a new node: only the persistent tier has it
    got = _run(
        MANAGER.format(persistent=persistent, local=local)
        + """
print(m.restore_or_initialize(), float(w.numpy()[1]), [p.tier for p in m.restore_plan().sources])
m.close()
"""
    )
    assert got == "4 7.0 ['persistent']"


def test_a_hashed_suffix_from_a_peer_is_checked() -> None:
    good = f"/{_hh(0, 1)}/data-00000-of-00001"
    msg = encode_parts([Part(1, 10, "t", [PartFile(good, b"a", 0), PartFile(".index", b"i", 0)])])
    assert [f.suffix for f in decode_parts(msg, "rank 1")[0].files] == [good, ".index"]
    wrong = f"/{int(_hh(0, 1), 16) ^ 1:02x}/data-00000-of-00001"
    for evil in (wrong, f"/{_hh(0, 1)}/../data-00000-of-00001", f"/{_hh(0, 1)}/x/data-0"):
        msg = encode_parts([Part(1, 10, "t", [PartFile(evil, b"a", 0)])])
        with pytest.raises(CorruptCheckpointError, match="not a checkpoint file suffix"):
            decode_parts(msg, "rank 1")


def test_hashed_needs_a_checkpoint_that_takes_it(tmp_path) -> None:
    class Own:
        def write(self, prefix: str, blocking: bool = True) -> str:
            return prefix

    with pytest.raises(sp.InvalidArgumentError, match="hashed_prefixes"):
        sp.TieredCheckpointManager(
            Own(), str(tmp_path / "p"), local_directory=str(tmp_path / "l"), hashed_prefixes=True
        )
