"""The benches' ``--only`` refuses a loader name it does not know (before, a misspelt row,
``--only safetensors_copy`` when the row was named ``safetensors``, ran nothing and said
nothing), before writing any file, and lists the valid names. And every bench module
imports: the benches are not run by ``make test``, and a helper they share with the tests
(``tests/s3_server.py``'s ``free_port``, removed there) broke four of them unnoticed."""

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


def test_every_bench_imports() -> None:
    """Each module under benches/ imports in a fresh process, as its command line does (the
    benches' directory and tests/ on the path)."""
    code = (
        "import importlib, pathlib, sys\n"
        f"sys.path[:0] = [{str(_BENCHES)!r}, {str(_BENCHES.parent / 'tests')!r}]\n"
        "bad = []\n"
        f"for p in sorted(pathlib.Path({str(_BENCHES)!r}).glob('*.py')):\n"
        "    try:\n"
        "        importlib.import_module(p.stem)\n"
        "    except BaseException as e:\n"
        "        bad.append(f'{p.name}: {e!r}')\n"
        "print(len(list(pathlib.Path(sys.path[0]).glob('*.py'))), bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert int(r.stdout.split()[0]) >= 30  # the modules were found and imported
