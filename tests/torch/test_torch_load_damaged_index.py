"""``torch.load`` of a sharded checkpoint whose index is damaged, in the next script's fresh
process: shardpoint's error naming the index, not torch's "No such file" for the prefix or
"Weights only load failed" for the index (found by a helper's hostile-file sweep)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import shardpoint.torch as spt  # noqa: E402


@pytest.mark.parametrize("named", ["prefix", "index"])
@pytest.mark.parametrize("damage", ["magic", "empty"])
def test_a_damaged_index_beside_its_shards_is_named(
    tmp_path: Path, named: str, damage: str
) -> None:
    prefix = tmp_path / "m"
    spt.save({"w": torch.ones(4), "b": torch.zeros(3)}, str(prefix), shards=2)
    index = tmp_path / "m.index"
    raw = bytearray(index.read_bytes())
    if damage == "magic":
        raw[3] ^= 4
    index.write_bytes(b"" if damage == "empty" else bytes(raw))
    target = str(prefix) if named == "prefix" else str(index)
    got = subprocess.run(
        [sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1], map_location='cpu')",
         target],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    last = got.stderr.strip().splitlines()[-1]
    assert got.returncode == 1
    assert last.startswith("shardpoint.errors.CorruptCheckpointError") and "m.index" in last, last


def test_a_file_named_index_without_shards_stays_torchs(tmp_path: Path) -> None:
    # nothing says it is ours: torch's own answer, unchanged
    (tmp_path / "e.index").write_bytes(b"")
    got = subprocess.run(
        [sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1])", str(tmp_path / "e")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 1 and "FileNotFoundError" in got.stderr.strip().splitlines()[-1]
