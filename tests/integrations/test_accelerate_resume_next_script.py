"""accelerate's own ``Accelerator.load_state`` reading a directory ``ShardpointAccelerator``
wrote, in a fresh process whose script never names shardpoint (the user's next script, or a
colleague's): ``load_state(dir)`` and, with automatic naming, ``load_state()``. Before the
front (``_shardpoint_loaders/accelerator_state.py``) it stopped at "No such file or directory:
'.../optimizer.bin'". Now the resumed run matches the uninterrupted one exactly (losses as hex
floats, a digest of the final weights, the registered object's state), with the weights as
safetensors and compressed in the part; accelerate's own directories stay its own; with the
reading turned off the error names shardpoint. Real accelerate, CPU."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

from integration_helpers import accel_run  # noqa: E402
from integration_helpers.common import run_child  # noqa: E402

CK0 = "checkpoints/checkpoint_0"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("accel_next")
    out: dict[str, Any] = {"base": base}
    for kind in ("shardpoint", "shardpoint-compressed", "native"):
        out[kind] = accel_run.train(kind, str(base / kind), 2)
    assert out["shardpoint"]["losses"] == out["native"]["losses"]
    return out


@pytest.mark.parametrize("kind", ["shardpoint", "shardpoint-compressed"])
def test_a_plain_accelerator_resumes_a_shardpoint_directory_exactly(
    uninterrupted: dict[str, Any], kind: str, tmp_path: Path
) -> None:
    ck = uninterrupted["base"] / kind / CK0
    assert not (ck / "optimizer.bin").exists()
    # `load_state()` with automatic naming: the newest checkpoint_<i> of the project
    latest = tmp_path / "latest"
    shutil.copytree(ck, latest / CK0)
    by_dir, by_latest = run_child(
        "accel_run", "native", str(tmp_path / "r"), "2", str(ck), ";",
        "native", str(latest), "2", "latest",
    )  # fmt: skip
    want = uninterrupted[kind]
    for got in (by_dir, by_latest):
        assert got["losses"] == want["losses"][4:]
        assert got["digest"] == want["digest"] == uninterrupted["native"]["digest"]
        assert got["progress"] == want["progress"]


def test_accelerates_own_directories_stay_its_own(uninterrupted: dict[str, Any]) -> None:
    base = uninterrupted["base"]
    (got,) = run_child(
        "accel_run", "native", str(base / "native-r"), "2", str(base / "native" / CK0)
    )
    assert got["losses"] == uninterrupted["native"]["losses"][4:]
    assert got["digest"] == uninterrupted["native"]["digest"]


def test_reading_turned_off_names_shardpoint(uninterrupted: dict[str, Any], tmp_path: Path) -> None:
    ck = uninterrupted["base"] / "shardpoint" / CK0
    with pytest.raises(AssertionError) as err:
        run_child(
            "accel_run", "native", str(tmp_path / "r"), "2", str(ck),
            env={"SHARDPOINT_TORCH_LOAD": "0"},
        )  # fmt: skip
    last = str(err.value).strip().splitlines()[-1]
    assert last.startswith("ValueError") and "ShardpointAccelerator" in last
