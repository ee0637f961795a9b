"""Hashed key prefixes (FORMAT.md §3.1.1), the files around the shards in a local directory:
partial indexes under ``P/HH/`` and their merge, the version ``shardpoint info`` prints, empty
hashed directories after ``gc``, and the manager's sweep of a hashed checkpoint cut short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp
from reference_crc import crc32c
from shardpoint.errors import CheckpointError
from shardpoint.storage import gc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))


def _tree(d) -> list[str]:
    """Every file under ``d`` (relative, sorted), lock files left out."""
    out = []
    for root, _, files in os.walk(d):
        out += [os.path.relpath(os.path.join(root, f), d) for f in files if not f.endswith(".lock")]
    return sorted(out)


def _dirs(d) -> list[str]:
    """Every directory under ``d`` (relative, sorted)."""
    return sorted(os.path.relpath(os.path.join(r, x), d) for r, ds, _ in os.walk(d) for x in ds)


def _hh(plain: str) -> str:
    """The hashed directory of a plain suffix, computed as FORMAT.md §3.1.1 says."""
    return f"{crc32c(plain.encode()) & 0xFF:02x}"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=ENV, capture_output=True, text=True
    )


def _ranks(p, world: int, *, hashed: bool, only: range | None = None) -> None:
    for r in only if only is not None else range(world):
        with sp.Writer(p, rank=r, world_size=world, merge_token="t", hashed_prefixes=hashed) as w:
            w.add(f"k{r}", np.full(8, r, np.int64))


def test_partial_indexes_go_under_hashed_directories_and_merge(tmp_path) -> None:
    p = tmp_path / "mw"
    _ranks(p, 3, hashed=True)
    parts = [
        f"mw/{_hh(f'.index.part-{r:05d}-of-00003')}/index.part-{r:05d}-of-00003" for r in range(3)
    ]
    shards = [f"mw/{_hh(f'.data-{s:05d}-of-00003')}/data-{s:05d}-of-00003" for s in range(3)]
    assert _tree(tmp_path) == sorted(parts + shards)  # nothing at `mw.index.part-…`
    # the merge reads partials in the form it is told: the other form is named in its error
    with pytest.raises(CheckpointError, match="hashed_prefixes=True"):
        sp.merge(p, 3, token="t")
    sp.merge(p, 3, token="t", hashed_prefixes=True)
    # the consumed partials went, and with them the directories they alone were in
    assert _tree(tmp_path) == sorted(["mw.index", *shards])
    assert _dirs(p) == sorted({os.path.basename(os.path.dirname(s)) for s in shards})
    got = _run(
        f"""
        import shardpoint as sp
        print(sorted((k, int(v[0])) for k, v in sp.load_file({os.fspath(p)!r}).items()))
        """
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[('k0', 0), ('k1', 1), ('k2', 2)]"


def test_unhashed_partials_still_merge_and_a_hashed_merge_says_so(tmp_path) -> None:
    p = tmp_path / "plain"
    _ranks(p, 2, hashed=False)
    assert _tree(tmp_path) == [
        "plain.data-00000-of-00002",
        "plain.data-00001-of-00002",
        "plain.index.part-00000-of-00002",
        "plain.index.part-00001-of-00002",
    ]
    with pytest.raises(CheckpointError, match="without hashed_prefixes"):
        sp.merge(p, 2, token="t", hashed_prefixes=True)
    sp.merge(p, 2, token="t")
    assert _tree(tmp_path) == [
        "plain.data-00000-of-00002",
        "plain.data-00001-of-00002",
        "plain.index",
    ]


def test_gc_removes_a_dead_saves_hashed_partials_and_empty_directories(tmp_path) -> None:
    _ranks(tmp_path / "dead", 2, hashed=True, only=range(1, 2))  # rank 0 never came
    (tmp_path / "kept").mkdir()
    _ranks(tmp_path / "kept", 2, hashed=True, only=range(1, 2))
    (tmp_path / "kept" / "notes.txt").write_text("a user's file: stays, and so does kept/")
    assert len(_tree(tmp_path)) == 2 + 2 + 1
    assert gc(os.fspath(tmp_path), older_than=0) == 4  # a shard and a partial of each
    assert _tree(tmp_path) == ["kept/notes.txt"]
    assert _dirs(tmp_path) == ["kept"]  # no empty `P/HH/`, no empty `P/`


def test_cli_info_prints_the_index_version(tmp_path) -> None:
    sp.save_file({"a": np.arange(5)}, tmp_path / "h", shards=2, hashed_prefixes=True)
    sp.save_file({"a": np.arange(5)}, tmp_path / "plain", shards=2)
    for name, version in (("h", 2), ("plain", 1)):
        cmd = [sys.executable, "-m", "shardpoint", "info", os.fspath(tmp_path / name)]
        out = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert f"format version: {version} (written by" in out.stdout, out.stdout
        out = subprocess.run([*cmd, "--json"], env=ENV, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["format_version"] == version


def test_manager_sweeps_a_hashed_checkpoint_whose_removal_was_cut_short(tmp_path) -> None:
    """A removal killed between the index and the shards leaves ``ckpt-1/HH/data-…`` without
    ``ckpt-1.index``; the next save's sweep removes them and the directories."""
    code = f"""
        import os, numpy as np, shardpoint as sp
        v = sp.Variable(np.zeros(4, np.float32))
        m = sp.CheckpointManager(sp.Checkpoint(v=v), {os.fspath(tmp_path)!r}, max_to_keep=2,
                                 hashed_prefixes=True)
        m.save()
        os.unlink(os.path.join({os.fspath(tmp_path)!r}, "ckpt-1.index"))  # the cut-short removal
        m.save()
        m.save()
        print(sorted(os.listdir({os.fspath(tmp_path)!r})))
        """
    got = _run(code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(
        ["checkpoint", "ckpt-2", "ckpt-2.index", "ckpt-3", "ckpt-3.index"]
    )
    assert all(not f.startswith("ckpt-1") for f in _tree(tmp_path))


def test_readers_of_a_path_take_a_hashed_prefix(tmp_path) -> None:
    """``P/`` beside ``P.index`` is the checkpoint, not a directory of checkpoints or a model
    directory: ``sp.load_checkpoint``/``sp.list_variables`` and the serving loaders (vLLM,
    SGLang and ``shardpoint.hf`` resolve paths with ``convert.serving.resolve``)."""
    from shardpoint.convert.serving import resolve

    p = tmp_path / "ck"
    sp.Checkpoint(v=sp.Variable(np.arange(10, dtype=np.float32))).write(p, hashed_prefixes=True)
    assert os.path.isdir(p)
    assert sp.load_checkpoint(p).get_variable_to_shape_map()["v/.ATTRIBUTES/VARIABLE_VALUE"] == [10]
    assert ("v/.ATTRIBUTES/VARIABLE_VALUE", [10]) in sp.list_variables(p)
    layout = resolve(p)
    assert (layout.directory, layout.whole) == (None, os.fspath(p))
