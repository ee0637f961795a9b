"""A torch.distributed.checkpoint user's state dict (a Stateful ``AppState`` over
``get_state_dict``/``set_state_dict``) saved in tiers through ``sptorch.StateDictCheckpoint``:
2 gloo ranks (DDP), each its own node, restored in new processes exactly from the local tier,
from the peer's replica after a node lost its local tier, and from the persistent tier after
both did (tiers_helpers.dcp_job)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from rank_rendezvous import run_rank_modules  # noqa: E402


def _job(root: Path, *args: str) -> list[list[dict[str, Any]]]:
    return run_rank_modules("tiers_helpers.dcp_job", root, args, timeout=240)


def test_dcp_state_dict_resumes_exactly_from_each_tier(tmp_path: Path) -> None:
    first = _job(tmp_path, "first")
    straight = [runs[0]["digests"] for runs in first]  # per rank, steps 1..10
    for r in range(2):
        assert first[r][1]["digests"] == straight[r][:7]
    # local saves at 2, 4, 6 (2 kept), persistent at 4; b: node 1 replaced; c: both
    for case, wiped in (("b", [1]), ("c", [0, 1])):
        shutil.copytree(tmp_path / "a", tmp_path / case)
        for n in wiped:
            shutil.rmtree(tmp_path / case / f"node-{n}")
    resumed = _job(tmp_path, "resume", "a", "b", "c")
    expect = {"a": (6, ["local", "local"]), "b": (6, ["local", "peer"]), "c": (4, None)}
    for r in range(2):
        for i, case in enumerate(("a", "b", "c")):
            run = resumed[r][i]
            step, tiers = expect[case]
            assert run["start"] == step, (case, run)
            assert run["tiers"] == (tiers or ["persistent", "persistent"]), (case, run)
            assert run["digests"] == straight[r][step:], (case, r)
