"""Fork safety (issue 36): a process forked after shardpoint has run works as a fresh process.

``fork()`` copies only the calling thread. Before, the child of a process that had saved or
decoded anything hung forever in its first parallel call (rayon's global pool, whose threads
stayed in the parent); the object store's runtime and connections, and locks other threads
held, are the same trap. Each scenario runs in a fresh interpreter
(``reliability_helpers/fork_child.py``) that first saves, loads, verifies and reads from a real
S3 server (moto), then forks: a bare ``os.fork``, a ``multiprocessing`` fork pool whose workers
read and write, and a torch ``DataLoader(num_workers=2)`` with fork workers after
``shardpoint.torch.load``. The child's deadline is in the script; this test's timeout, which
kills the whole process group, is the backstop, so a regression fails instead of hanging the
suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("boto3", reason="needs boto3 (requirements-dev)")

from s3_server import Moto  # noqa: E402 - after the importorskips

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
#: Backstop on a whole scenario (its children have 40 s in the script itself).
SCENARIO_SECONDS = 150


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    m = Moto()
    try:
        yield m
    finally:
        m.server.stop()


def _run(scenario: str, directory: str, moto: Moto) -> str:
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=moto.endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reliability_helpers.fork_child",
            scenario,
            directory,
            moto.bucket(),
        ],
        cwd=HERE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the children too are killed by the backstop
    )
    try:
        out, err = proc.communicate(timeout=SCENARIO_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{scenario}: hung past {SCENARIO_SECONDS} s\n{out}\n{err[-3000:]}")
    assert "HUNG" not in out, f"{scenario}: a forked child hung\n{out}\n{err[-3000:]}"
    assert proc.returncode == 0, f"{scenario}: exit {proc.returncode}\n{out}\n{err[-3000:]}"
    return out


def test_forked_child_reads_and_writes(tmp_path, moto) -> None:
    """The issue's snippet, grown: the child decodes through a reader its parent opened (local
    and remote), through fresh ones, ``load_file``, ``verify``, and saves locally and to S3;
    the parent then reads what the child wrote."""
    out = _run("fork", str(tmp_path), moto)
    assert "CHILD " in out and "OK " in out, out


def test_multiprocessing_fork_pool_reads_and_writes(tmp_path, moto) -> None:
    out = _run("pool", str(tmp_path), moto)
    assert "OK " in out, out


def test_dataloader_fork_workers_after_torch_load(tmp_path, moto) -> None:
    """The everyday form: ``shardpoint.torch.load`` in the training script, then a
    ``DataLoader`` whose fork workers read shardpoint files (local and S3)."""
    pytest.importorskip("torch")
    out = _run("dataloader", str(tmp_path), moto)
    assert "OK " in out, out
