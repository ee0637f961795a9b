"""The test suite's own scheduling (tests/conftest.py, ``pytest_xdist_make_scheduler``): under
``-n 2 --dist loadgroup`` a file's tests run on one worker, and the files of one serial group
share a worker. It once broke silently (xdist's group marks were dropped under pytest 9.2 and
every test was scheduled alone), so it is checked with a real two-worker run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

_RECORDING_TEST = """
import os, time
import pytest

@pytest.mark.parametrize("i", range(4))
def test_records_worker(i):
    time.sleep(0.05)
    with open(os.environ["RECORD"], "a") as f:
        f.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def test_files_and_serial_groups_stay_on_one_worker(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(_CONFTEST, suite / "conftest.py")
    # two files of the serial "multiprocess" group and two ordinary files
    names = ["test_torch_distributed", "test_lightning_ddp", "test_plain_a", "test_plain_b"]
    for name in names:
        (suite / f"{name}.py").write_text(_RECORDING_TEST)
    record = tmp_path / "record.txt"
    env = {k: v for k, v in os.environ.items() if k != "SHARDPOINT_REQUIRE_OPTIONAL"}
    env["RECORD"] = str(record)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
        + ["-n", "2", "--dist", "loadgroup", str(suite)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers: dict[str, set[str]] = {}
    for line in record.read_text().splitlines():
        module, worker = line.split()
        workers.setdefault(module, set()).add(worker)
    assert sorted(workers) == sorted(names), workers
    for module, used in workers.items():
        assert len(used) == 1, f"{module}'s tests ran on {sorted(used)}"
    assert workers["test_torch_distributed"] == workers["test_lightning_ddp"], workers
