"""Start-of-job reads done by one rank (docs/SCALE.md): with ``shardpoint.torch.share_listings``
a job of real gloo processes lists the checkpoint directory and reads its state object once,
not once per rank, and every rank restores the same checkpoint; without it each rank makes
its own requests (counted at a proxy in front of a moto S3 server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("torch.distributed", reason="needs torch")

import shardpoint as sp  # noqa: E402
from s3_server import Proxy, moto_environment, request_kind  # noqa: E402

RANKS = 3
WORKER = Path(__file__).resolve().parents[1] / "shared_listings_worker.py"


def _phases(proxy: Proxy) -> list[dict[str, int]]:
    """The requests before and after the worker's phase marker, by kind (the state object's
    GETs as ``STATE``, the marker itself left out)."""
    phases: list[dict[str, int]] = [{}, {}]
    at = 0
    for method, path, _ in proxy.requests():
        key = path.partition("?")[0]
        if key.endswith("/phase-marker"):
            at = 1
            continue
        kind = (
            "STATE"
            if method == "GET" and key.endswith("/checkpoint")
            else request_kind(method, path)
        )
        phases[at][kind] = phases[at].get(kind, 0) + 1
    return phases


def test_one_rank_lists_and_reads_the_state(tmp_path: Path) -> None:
    with moto_environment() as moto:
        url = f"s3://{moto.bucket()}/run"
        ckpt = sp.Checkpoint(v=sp.Variable(np.arange(3, dtype=np.float32)))
        manager = sp.CheckpointManager(ckpt, url, max_to_keep=3)
        manager.save()
        ckpt.v.assign(np.arange(3, dtype=np.float32) + 10)
        latest = manager.save()
        proxy = Proxy(moto.port)
        try:
            env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
            cmd = [sys.executable, str(WORKER)]
            procs = [
                subprocess.Popen(
                    [*cmd, str(r), str(RANKS), str(tmp_path / "init"), url],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for r in range(RANKS)
            ]
            for p in procs:
                stdout, stderr = p.communicate(timeout=180)
                assert p.returncode == 0, stderr[-3000:]
                got = [json.loads(line) for line in stdout.strip().splitlines()[-2:]]
                assert got == [{"path": latest, "latest": latest, "v": [10.0, 11.0, 12.0]}] * 2
            alone, shared = _phases(proxy)
        finally:
            proxy.close()
    # per job: the manager's restore lists the directory once; its __init__, its restore and
    # latest_checkpoint read the state object; restore checks its 2 candidates' indexes and
    # latest_checkpoint its answer's (HEAD). Each rank on its own, one rank when shared.
    # The restores themselves (the index and data GETs) are every rank's own.
    for phase, per_job in ((alone, RANKS), (shared, 1)):
        assert phase.get("LIST") == per_job, phase
        assert phase.get("STATE") == 3 * per_job, phase
        assert phase.get("HEAD") == 3 * per_job, phase
    assert alone["GET"] == shared["GET"] > 0  # the restores' reads, the same in both
