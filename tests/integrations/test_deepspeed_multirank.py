"""DeepSpeed ZeRO-2 and ZeRO-3 on 2 ranks (gloo, two CPU processes) through shardpoint: a run
saves, is SIGKILLed mid-save (rank 0 kills itself while writing global_step6, rank 1 is
killed waiting for it) and a new 2-rank job resumes from ``latest`` exactly — losses and final
parameters equal the uninterrupted run's and DeepSpeed's own. DeepSpeed's consolidation of a
ZeRO checkpoint (``zero_to_fp32``) reads ours: through ``shardpoint.integrations.zero_to_fp32``
and through the ``zero_to_fp32.py`` in the checkpoint folder, equal to DeepSpeed's own on
its own files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from integration_helpers.common import (  # noqa: E402
    assert_same_tree,
    digest,
    pickles_under,
    run_ranks,
)

ENV = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
STAGES = ("2", "3")
KINDS = ("shardpoint", "native")


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted 2-rank runs (6 steps, checkpoints at steps 3 and 6), per rank."""
    base = tmp_path_factory.mktemp("ds2")
    jobs: list[str] = []
    names = []
    for stage in STAGES:
        for kind in KINDS:
            jobs += ["train", kind, str(base / f"{kind}{stage}"), "6", stage, ";"]
            names.append(f"{kind}{stage}")
    ranks = run_ranks("ds_run", *jobs[:-1], env=ENV)
    return {"base": base, **{n: [r[i] for r in ranks] for i, n in enumerate(names)}}


@pytest.mark.parametrize("stage", STAGES)
def test_two_ranks_killed_mid_save_resume_exactly(
    full: dict[str, Any], tmp_path: Path, stage: str
) -> None:
    ours, native = full[f"shardpoint{stage}"], full[f"native{stage}"]
    for rank in (0, 1):
        assert ours[rank]["losses"] == native[rank]["losses"]
        assert ours[rank]["digest"] == native[rank]["digest"]
    assert ours[0]["losses"] != ours[1]["losses"]  # each rank trained on its own batches
    run = tmp_path / "killed"
    codes = run_ranks(
        "ds_run", "train", "shardpoint", str(run), "6", stage, env=ENV, kill_rank0_at_save=3
    )
    assert codes == [-9, -9]
    assert (run / "latest").read_text() == "global_step3"  # global_step6 never committed
    resumed = run_ranks("ds_run", "resume", "shardpoint", str(run), "6", stage, "latest", env=ENV)
    for rank in (0, 1):
        (got,) = resumed[rank]
        assert got["losses"] == ours[rank]["losses"][3:]
        assert got["digest"] == ours[rank]["digest"]
    assert pickles_under(run) == []


@pytest.mark.parametrize("stage", STAGES)
def test_zero_to_fp32_consolidates_our_checkpoint(
    full: dict[str, Any], tmp_path: Path, stage: str
) -> None:
    from deepspeed.utils import zero_to_fp32 as deepspeeds
    from safetensors.torch import load_file

    from shardpoint.integrations import zero_to_fp32

    ours_dir, native_dir = full["base"] / f"shardpoint{stage}", full["base"] / f"native{stage}"
    consolidated = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(ours_dir)
    reference = deepspeeds.get_fp32_state_dict_from_zero_checkpoint(str(native_dir))
    assert_same_tree(consolidated, reference)
    assert digest(consolidated) == full[f"shardpoint{stage}"][0]["digest"]  # the final weights
    # the script DeepSpeed puts in the checkpoint folder (ours there), with its arguments
    script = ours_dir / "zero_to_fp32.py"
    assert "shardpoint" in script.read_text()
    assert "shardpoint" not in (native_dir / "zero_to_fp32.py").read_text()
    proc = subprocess.run(
        [sys.executable, str(script), str(ours_dir), str(tmp_path / "out"), "--safe_serialization"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_tree(load_file(tmp_path / "out" / "model.safetensors"), reference)
    # `shardpoint verify` of a tag folder checks every rank's files
    ok = subprocess.run(
        [sys.executable, "-m", "shardpoint", "verify", str(ours_dir / "global_step6")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("deepspeed") == len(list((ours_dir / "global_step6").glob("*.pt")))


#: a user's script: DeepSpeed's own consolidation functions, nothing of shardpoint imported
DEEPSPEED_OWN = """
import sys
from deepspeed.utils.zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
)
from safetensors.torch import save_file

state = get_fp32_state_dict_from_zero_checkpoint(sys.argv[1])
save_file({k: v.contiguous() for k, v in state.items()}, sys.argv[2])
convert_zero_checkpoint_to_fp32_state_dict(sys.argv[1], sys.argv[3], safe_serialization=True)
"""


@pytest.mark.parametrize("stage", ["2"])
def test_deepspeeds_own_functions_read_our_checkpoint_in_a_fresh_process(
    full: dict[str, Any], tmp_path: Path, stage: str
) -> None:
    """DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` and
    ``convert_zero_checkpoint_to_fp32_state_dict`` (what Lightning's converter and users'
    scripts call), in a new process that never imports shardpoint: torch.load's front (the
    startup file the wheel installs) serves the ``*_states.pt`` directories."""
    from deepspeed.utils import zero_to_fp32 as deepspeeds
    from safetensors.torch import load_file

    ours_dir, native_dir = full["base"] / f"shardpoint{stage}", full["base"] / f"native{stage}"
    assert (ours_dir / "global_step6" / "mp_rank_00_model_states.pt").is_dir()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DEEPSPEED_OWN,
            str(ours_dir),
            str(tmp_path / "a.safetensors"),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = deepspeeds.get_fp32_state_dict_from_zero_checkpoint(str(native_dir))
    assert_same_tree(load_file(tmp_path / "a.safetensors"), reference)
    assert_same_tree(load_file(tmp_path / "out" / "model.safetensors"), reference)
