"""``gc`` of a local directory (storage/local_gc.py): what saves that never committed left is
removed; committed checkpoints, files a live writer holds, young files and other files stay."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.cli import main as cli
from shardpoint.errors import InvalidArgumentError


def _files(d) -> set[str]:
    return {n for n in os.listdir(d) if not n.endswith(".lock")}


def test_gc_removes_partials_and_unreferenced_shards_only(tmp_path) -> None:
    d = tmp_path
    sp.save_file({"a": np.arange(5)}, d / "kept")
    (d / "notes.txt").write_text("not a checkpoint's")
    kept = _files(d)
    # a multi-writer save whose coordinator never merged: shards + partial indexes
    for r in range(2):
        with sp.Writer(d / "dead", rank=r, world_size=2) as w:
            w.add(f"k{r}", np.arange(3))
    # a stray shard beside a committed checkpoint (a save that died after publishing it)
    (d / "kept.data-00007-of-00009").write_bytes(b"x" * 10)
    assert len(_files(d)) == len(kept) + 5
    assert sp.storage.gc(str(d), older_than=3600) == 0  # all too young
    assert sp.storage.gc(str(d), older_than=0) == 5
    assert _files(d) == kept
    np.testing.assert_array_equal(sp.load_file(d / "kept")["a"], np.arange(5))


def test_gc_spares_a_live_writers_temp_files(tmp_path) -> None:
    w = sp.Writer(tmp_path / "live", rank=0, world_size=2)
    w.add("k", np.arange(1000))
    temps = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert temps, os.listdir(tmp_path)
    assert sp.storage.gc(str(tmp_path), older_than=0) == 0  # locked by the live writer
    assert all(os.path.exists(tmp_path / t) for t in temps)
    w.commit()
    assert sp.storage.gc(str(tmp_path), older_than=0) == 2  # its shard and partial
    assert _files(tmp_path) == set()


def test_gc_cli_and_bad_directory(tmp_path, capsys) -> None:
    with sp.Writer(tmp_path / "p", rank=1, world_size=2) as w:
        w.add("k", np.arange(2))
    old = time.time() - 7200
    for n in os.listdir(tmp_path):
        os.utime(tmp_path / n, (old, old))
    assert cli(["gc", str(tmp_path)]) == 0  # default: older than an hour
    assert "removed 2" in capsys.readouterr().out
    with pytest.raises(InvalidArgumentError):
        sp.storage.gc(str(tmp_path / "missing"))
