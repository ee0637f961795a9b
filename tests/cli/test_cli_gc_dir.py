"""``shardpoint gc DIR`` (cli/gc_dir.py): checkpoints neither kept nor needed are deleted; a base
that a kept delta checkpoint's chain reads never is, nor anything when a chain cannot be
followed; a state file says what is kept; young checkpoints are spared."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.cli.gc_dir import plan_gc
from shardpoint.cli.main import main


def _chain(d: str) -> list[str]:
    """full-0, d-1 -> full-0, d-2 -> d-1, full-3, d-4 -> full-3 (saved in that order)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(1 << 14).astype(np.float32)
    names, prev = [], None
    for i, kind in enumerate(["full", "d", "d", "full", "d"]):
        w = w.copy()
        w[i::64] += 1e-3
        p = os.path.join(d, f"{kind}-{i}")
        if kind == "full":
            sp.save_file({"w": w}, p)
        else:
            sp.save_file({"w": w}, p, base=prev, delta=True)
        os.utime(p + ".index", (1000.0 + i, 1000.0 + i))  # a clear order, old enough
        names.append(p)
        prev = p
    return names


def _present(d: str) -> list[str]:
    return sorted(f[: -len(".index")] for f in os.listdir(d) if f.endswith(".index"))


def test_keep_last_spares_the_chain_of_kept_deltas(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    d = os.fspath(tmp_path)
    names = _chain(d)
    # keeping the 3 newest (d-2, full-3, d-4) keeps d-2's chain (d-1, full-0) too
    assert main(["gc", d, "--keep-last", "3", "--older-than", "0", "--dry-run"]) == 0
    assert "would delete 0 checkpoint(s)" in capsys.readouterr().out
    assert _present(d) == ["d-1", "d-2", "d-4", "full-0", "full-3"]
    assert main(["gc", d, "--keep-last", "1", "--older-than", "0"]) == 0
    out = capsys.readouterr().out
    assert "deleted 3 checkpoint(s)" in out and "1 more that kept delta" in out
    assert _present(d) == ["d-4", "full-3"]
    assert sp.load_file(names[4])["w"].shape == (1 << 14,)
    assert spd.needed_bases(names[4]) == [os.path.abspath(names[3])]


def test_kept_middle_of_a_chain_keeps_everything_below(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    names = _chain(d)
    os.utime(names[2] + ".index", (2000.0, 2000.0))  # d-2 is now the newest
    assert main(["gc", d, "--keep-last", "1", "--older-than", "0"]) == 0
    assert _present(d) == ["d-1", "d-2", "full-0"]
    sp.load_file(names[2])  # resolves through d-1 and full-0


def test_broken_chain_deletes_nothing(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    names = _chain(d)
    with open(names[3] + ".index", "r+b") as f:  # the kept d-4's base: damaged index
        f.seek(40)
        f.write(b"\xff" * 8)
    with pytest.raises(sp.CheckpointError, match="deletes nothing"):
        plan_gc(d, 1, 0.0)
    assert main(["gc", d, "--keep-last", "1", "--older-than", "0"]) != 0
    assert len(_present(d)) == 5


def test_state_file_and_age(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    names = _chain(d)
    with open(os.path.join(d, "checkpoint"), "w", encoding="utf-8") as f:
        f.write('model_checkpoint_path: "d-2"\nall_model_checkpoint_paths: "d-2"\n')
    os.utime(names[4] + ".index")  # d-4: just written (a save in flight), spared by age
    before = _present(d)
    assert main(["gc", d]) == 0  # without --keep-last: only what dead saves left, no checkpoint
    assert _present(d) == before
    assert main(["gc", d, "--keep-last", "0"]) == 0  # the state file's list; default age 3600
    assert _present(d) == ["d-1", "d-2", "d-4", "full-0"]
    os.remove(os.path.join(d, "checkpoint"))
    with pytest.raises(sp.InvalidArgumentError, match="--keep-last"):
        plan_gc(d, None, 0.0)
    with pytest.raises(sp.InvalidArgumentError, match="not a directory"):
        plan_gc(os.path.join(d, "nope"), 1, 0.0)
