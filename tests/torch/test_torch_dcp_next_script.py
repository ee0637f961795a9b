"""DCP's own readers on a checkpoint shardpoint's DCP ``StorageWriter`` wrote, in a fresh process
whose script never names shardpoint: ``dcp.load(sd, checkpoint_id=P)``,
``dcp.load(sd, storage_reader=FileSystemReader(P))`` and
``format_utils.dcp_to_torch_save(P, out)`` (the front ``_shardpoint_loaders/dcp_reader.py``
installs). Before, each said "No such file or directory: 'P/.metadata'". DCP's own directories
stay DCP's; a torn index is named by shardpoint's error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import shardpoint.torch as spt  # noqa: E402

NEXT = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

def empty():
    return {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
            "step": 0, "names": []}

def show(sd):
    return {"w": sd["model"]["w"].tolist(), "b": sd["model"]["b"].float().tolist(),
            "step": sd["step"], "names": sd["names"]}

path, out = sys.argv[1:3]
by_id = empty()
dcp.load(by_id, checkpoint_id=path)
by_reader = empty()
reader = dcp.FileSystemReader(path)
dcp.load(by_reader, storage_reader=reader)
dcp_to_torch_save(path, out)
whole = torch.load(out, weights_only=True)
print(json.dumps({"by_id": show(by_id), "by_reader": show(by_reader), "whole": show(whole),
                  "reader": type(reader).__module__ + "." + type(reader).__name__}))
"""


def _state() -> dict:
    return {
        "model": {
            "w": torch.arange(12.0).reshape(3, 4),
            "b": torch.linspace(-1, 1, 4).to(torch.bfloat16),
        },
        "step": 7,
        "names": ["a", "b"],
    }


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NEXT), *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _want() -> dict:
    s = _state()
    return {
        "w": s["model"]["w"].tolist(),
        "b": s["model"]["b"].float().tolist(),
        "step": 7,
        "names": ["a", "b"],
    }


@pytest.mark.parametrize("layout", ["prefix", "directory"])
def test_dcps_own_readers_read_what_shardpoint_wrote_in_the_next_script(
    tmp_path: Path, layout: str
) -> None:
    where = tmp_path / "ckpt"
    if layout == "directory":  # one checkpoint in a directory of its own
        where.mkdir()
        prefix = where / "step-7"
    else:
        prefix = where
    dcp.save(_state(), storage_writer=spt.StorageWriter(str(prefix)), no_dist=True)
    p = _run(str(where), str(tmp_path / "whole.pt"))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["by_id"] == got["by_reader"] == got["whole"] == _want()
    assert got["reader"] == "shardpoint.torch.dcp.StorageReader"


def test_dcps_own_checkpoints_stay_dcps(tmp_path: Path) -> None:
    where = tmp_path / "native"
    dcp.save(_state(), checkpoint_id=str(where), no_dist=True)
    p = _run(str(where), str(tmp_path / "whole.pt"))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["by_id"] == got["whole"] == _want()
    assert got["reader"].endswith("filesystem.FileSystemReader")


def test_turned_off_or_torn_checkpoints(tmp_path: Path) -> None:
    prefix = tmp_path / "ckpt"
    dcp.save(_state(), storage_writer=spt.StorageWriter(str(prefix)), no_dist=True)
    # turned off: DCP's own error, as before the front
    p = _run(str(prefix), str(tmp_path / "w.pt"), env={"SHARDPOINT_TORCH_LOAD": "0"})
    assert p.returncode != 0 and ".metadata" in p.stderr
    # a torn index: shardpoint's error names the file
    index = Path(str(prefix) + ".index")
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    p = _run(str(prefix), str(tmp_path / "w.pt"))
    assert p.returncode != 0 and "ckpt.index" in p.stderr and "Corrupt" in p.stderr
