"""The benches' ``--only`` refuses a loader name it does not know (before, a misspelt row,
``--only safetensors_copy`` when the row was named ``safetensors``, ran nothing and said
nothing), before writing any file, and lists the valid names."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

_BENCHES = pathlib.Path(__file__).resolve().parents[2] / "benches"


@pytest.mark.parametrize(
    ("script", "valid"),
    [("bench_load.py", "safetensors_copy"), ("bench_serving.py", "fastsafetensors")],
)
def test_unknown_only_name_is_refused(tmp_path: pathlib.Path, script: str, valid: str) -> None:
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(_BENCHES / script), "--only", f"{valid},nosuch", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "unknown loader(s) 'nosuch'" in r.stderr
    assert valid in r.stderr.split("valid:")[1]  # the valid names are listed
    assert not out.exists()  # refused before the setup wrote anything
