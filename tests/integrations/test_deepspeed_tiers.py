"""DeepSpeed ZeRO-2 on 2 gloo ranks (CPU, new processes, each rank its own node) with its
checkpoints in the tiers: ``use_shardpoint(engine, local_directory=...)``. A new job restores
exactly (losses, parameters, each rank's fp32 partition and Adam moments after every later
step equal the uninterrupted run's) from the local tier; with node 0's local tier wiped, rank 0's
part from rank 1's replica; with both wiped, from the persistent tier. Rank 1 reads the
model-states file only rank 0 wrote: it is fetched from rank 0 each time
(integration_helpers.ds_tiers_run)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("torch")

from rank_rendezvous import run_rank_modules  # noqa: E402


def _job(root: Path, *args: str) -> list[list[dict[str, Any]]]:
    return run_rank_modules("integration_helpers.ds_tiers_run", root, args, timeout=600)


def test_deepspeed_resumes_exactly_from_each_tier(tmp_path: Path) -> None:
    first = _job(tmp_path, "first")
    for r in range(2):
        (run,) = first[r]
        assert run["loaded"] is False and run["restored"] is None  # nothing saved yet
        assert len(run["steps"]) == 8
        refused = run["refused"]
        assert sorted(refused) == ["local_every", "no_local", "outside_load", "tag"]
        assert refused["tag"].startswith("InvalidArgumentError") and "pass no tag" in refused["tag"]
        assert "local_every is not taken" in refused["local_every"]
        assert "tiers= needs local_directory=" in refused["no_local"]
        assert "only inside engine.load_checkpoint" in refused["outside_load"]
    assert first[0][0]["steps"] != first[1][0]["steps"]  # each rank trained on its own batches
    straight = [first[r][0]["steps"] for r in range(2)]
    bucket = tmp_path / "a" / "bucket"
    # the files went to the tiers: the save directory holds the persistent tier (step 4 of the
    # saves at 2, 4, 6) and DeepSpeed's own `latest`
    assert sorted(os.listdir(bucket)) == ["ckpt-4", "latest"]
    assert (bucket / "latest").read_text() == "global_step6"
    for case, wiped in (("b", [0]), ("c", [0, 1])):
        shutil.copytree(tmp_path / "a", tmp_path / case)
        for n in wiped:
            shutil.rmtree(tmp_path / case / f"node-{n}")
    resumed = _job(tmp_path, "resume", "a", "b", "c")
    expect = {
        "a": (6, ["local", "local"]),
        "b": (6, ["peer", "local"]),
        "c": (4, ["persistent", "persistent"]),
    }
    for r in range(2):
        for i, case in enumerate(("a", "b", "c")):
            run = resumed[r][i]
            step, tiers = expect[case]
            assert run["loaded"] is True, (case, run)
            assert (run["restored"], run["start"]) == (step, step), (case, run)
            assert run["tiers"] == tiers, (case, run)
            assert run["steps"] == straight[r][step:], (case, r)
            # DeepSpeed's model states are written by rank 0 and read by both ranks
            fetched = {} if r == 0 else {"mp_rank_00_model_states.pt": 0}
            assert run["fetched"] == fetched, (case, r)
