"""Lightning DDP on 2 real CPU processes with ``ShardpointTiers``: one rank's local tier wiped
(its node replaced), the job resumes with that rank's part from the other rank's replica and
ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("torch")

from integration_helpers.common import TESTS  # noqa: E402
from rank_rendezvous import rendezvous_env  # noqa: E402


def run(root: Path, epochs: int, *extra: str) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    with rendezvous_env() as rendezvous:  # Lightning's ranks meet at a store served here
        proc = subprocess.run(
            [sys.executable, "-m", "integration_helpers.lightning_tiers_ddp", str(root),
             str(epochs), *extra],
            capture_output=True, text=True, env={**env, **rendezvous}, timeout=600,
            start_new_session=True,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_replaced_node_resumes_from_its_peer_exactly(tmp_path: Path) -> None:
    straight = run(tmp_path / "straight", 4, "none")
    assert straight["global_step"] == 8  # 2 steps per epoch: each rank takes half the batches
    root = tmp_path / "job"
    first = run(root, 3)  # steps 2, 4, 6 in the local tiers (with replicas), 4 persistent
    assert first["restored"] is None and first["global_step"] == 6
    shutil.rmtree(root / "node-1")  # rank 1's node replaced
    resumed = run(root, 4)
    assert resumed["restored"] == 6 and resumed["tiers"] == ["local", "peer"]
    assert resumed["global_step"] == 8 and resumed["digest"] == straight["digest"]
