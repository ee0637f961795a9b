"""``shardpoint info``/``verify``/``ls`` on a CheckpointManager directory act on it as ``ls``
lists it (its latest checkpoint), also on an object store named as the manager was given it
(no trailing slash) and on a directory without a state file; ``ls`` prints keys sorted for
every format."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.cli import EXIT_OK, EXIT_USAGE, main


def _manager(directory: str) -> str:
    ckpt = sp.Checkpoint(v=sp.Variable(1.0))
    manager = sp.CheckpointManager(ckpt, directory, max_to_keep=3)
    manager.save()
    ckpt.v.assign(2.0)
    path = manager.save()
    assert path is not None
    return path


@pytest.mark.parametrize("where", ["local", "memory"])
def test_info_and_verify_act_on_the_latest_checkpoint(
    where: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path / "run") if where == "local" else f"memory://b/{tmp_path.name}/run"
    latest = _manager(directory)
    capsys.readouterr()
    assert main(["info", "--json", directory]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["checkpoint"] == latest
    assert main(["verify", directory]) == EXIT_OK
    assert latest in capsys.readouterr().out
    assert main(["ls", "--json", directory]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [c["prefix"] for c in listed if c["latest"]] == [latest]


def test_directory_without_state_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sp.save_file({"a": np.ones(2)}, str(tmp_path / "one" / "ck-7"))
    assert main(["verify", str(tmp_path / "one")]) == EXIT_OK
    assert "ck-7" in capsys.readouterr().out
    sp.save_file({"a": np.ones(2)}, str(tmp_path / "one" / "ck-8"))
    assert main(["info", str(tmp_path / "one")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "2 checkpoints" in err and "ck-7" in err and "name one" in err


def test_ls_prints_keys_sorted_for_every_format(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.numpy import save_file as st_save

    keys = ["zeta", "Alpha", "b/2", "b.1", "é", "a"]
    dtypes = [np.float64, np.int8, np.float32, np.int16, np.float64, np.uint8]
    # mixed dtypes: safetensors lays data out by alignment first, not by name
    values = {k: np.full(1 + i, i, dt) for i, (k, dt) in enumerate(zip(keys, dtypes, strict=True))}
    sp.save_file(values, str(tmp_path / "ck"))
    st_save(values, str(tmp_path / "m.safetensors"))
    os.mkdir(tmp_path / "hf")
    st_save(values, str(tmp_path / "hf" / "model.safetensors"))
    orders = []
    for path in (tmp_path / "ck", tmp_path / "m.safetensors", tmp_path / "hf"):
        capsys.readouterr()
        assert main(["ls", "--json", str(path)]) == EXIT_OK
        orders.append([e["key"] for e in json.loads(capsys.readouterr().out)["entries"]])
    assert orders[0] == sorted(keys)
    assert orders[1] == orders[0] and orders[2] == orders[0]
