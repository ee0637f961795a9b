"""Rough edges of the tools (issue 40): ``shardpoint info`` reports what a checkpoint occupies
on disk (a single file's real size; a prefix's index plus shards), a path that is not there
names what the user typed and both forms looked for, and the demo prints no rate for an open
(a header read: a GB/s figure beside it meant nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.cli import main
from shardpoint.cli.common import human
from shardpoint.demo import _timed


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal(15000).astype(np.float32), "b": np.zeros(3, np.int64)}


def _info(path: str, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["info", path, *flags]) == 0
    return capsys.readouterr().out


def test_info_of_a_single_file_reports_its_real_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "model.pt")
    sp.save_file(_weights(), path, durable=False)
    size = os.path.getsize(path)
    assert json.loads(_info(path, capsys, "--json"))["total_bytes"] == size
    text = _info(path, capsys)
    assert f"on disk:        {human(size)} ({size:,} bytes)" in text
    assert "inside the single file" in text


def test_info_of_a_prefix_reports_index_plus_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "ck")
    sp.save_file(_weights(), prefix, shards=2, compression="none", durable=False)
    files = [f for f in os.listdir(tmp_path) if f.startswith("ck.")]
    assert len(files) == 3
    want = sum(os.path.getsize(tmp_path / f) for f in files)
    assert json.loads(_info(prefix, capsys, "--json"))["total_bytes"] == want
    assert f"({want:,} bytes)" in _info(prefix, capsys)


@pytest.mark.parametrize("name", ["modle.pt", "missing/dir/ck"])
def test_a_missing_checkpoint_names_the_path_given_and_the_forms_tried(
    tmp_path: Path, name: str
) -> None:
    path = str(tmp_path / name)
    with pytest.raises(sp.NotFoundError) as e:
        sp.load_file(path)
    assert isinstance(e.value, FileNotFoundError)
    msg = str(e.value)
    assert msg.startswith(f"no checkpoint at {path!r}")
    assert f"the single file {path!r}" in msg and repr(path + ".index") in msg
    if "/" in name:
        assert "does not exist" in msg


def test_a_missing_shard_keeps_the_error_naming_the_shard(tmp_path: Path) -> None:
    prefix = str(tmp_path / "ck")
    sp.save_file(_weights(), prefix, compression="none", durable=False)
    shard = next(f for f in os.listdir(tmp_path) if ".data-" in f)
    os.remove(tmp_path / shard)
    with pytest.raises(sp.NotFoundError, match=shard):
        sp.load_file(prefix)


@pytest.mark.parametrize("form", ["prefix", "directory"])
@pytest.mark.parametrize("command", ["verify", "info", "ls"])
def test_a_lost_index_is_named_by_the_tools(tmp_path: Path, form: str, command: str) -> None:
    """Data shards whose ``.index`` is gone (a copy that left it out): the tools, in a fresh
    process, say that the index is missing and the data is there (before: "no such file or
    checkpoint" / "directory holds no checkpoint"), exit 3 (not found)."""
    prefix = tmp_path / "checkpoint"
    sp.save_file(_weights(), str(prefix), shards=2, compression="none", durable=False)
    os.remove(str(prefix) + ".index")
    path = str(prefix if form == "prefix" else tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "shardpoint", command, path], capture_output=True, text=True
    )
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert f"index {str(prefix) + '.index'!r} is missing" in r.stderr, r.stderr
    assert "checkpoint.data-00000-of-00002" in r.stderr, r.stderr


def test_the_demo_prints_a_rate_only_for_steps_that_move_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _timed("open (index header only)", lambda: 7, None) == 7
    line = capsys.readouterr().out
    assert "ms" in line and "GB/s" not in line
    _timed("load", lambda: None, 1 << 30)
    assert "GB/s" in capsys.readouterr().out


def test_every_command_is_listed_in_the_cli_page() -> None:
    import argparse

    from shardpoint.cli.parser import build_parser

    page = (Path(__file__).resolve().parents[2] / "docs" / "CLI.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [name for name in sub.choices if f"| `shardpoint {name}" not in page]
    assert not missing, f"docs/CLI.md's table lacks {missing}"
