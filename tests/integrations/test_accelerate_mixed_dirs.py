"""A project that adds the one line (``ShardpointAccelerator``) to an accelerate run that already
saved with the plain ``Accelerator``, or a plain script saving over one of ours: every load in a
fresh process reads the newest save, whoever wrote it, and no complete checkpoint is deleted.

Before: ours saved into a directory holding accelerate's pickles and left them there, so a
plain ``Accelerator.load_state`` read the old optimizer, scheduler and RNG beside the new
weights, silently; ``ShardpointAccelerator`` could not resume accelerate's own checkpoints, and
with automatic naming deleted a complete one as if it were a killed save of ours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

#: ``RUN DIR native|sp STEPS save|load [auto]``: train STEPS steps and ``save_state(DIR)``, or
#: ``load_state(DIR)`` into fresh objects; ``auto``: automatic naming under DIR
RUN = """
import json, sys, torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

d, mode, steps, action = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
auto = len(sys.argv) > 5
if mode == "sp":
    from shardpoint.integrations.accelerate import ShardpointAccelerator as Accelerator
kw = {"project_config": ProjectConfiguration(d, automatic_checkpoint_naming=True)} if auto else {}
acc = Accelerator(cpu=True, **kw)
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
o = torch.optim.AdamW(m.parameters(), lr=0.1)
s = torch.optim.lr_scheduler.StepLR(o, 1, 0.5)
m, o, s = acc.prepare(m, o, s)
out = {}
try:
    if action == "save":
        for _ in range(steps):
            acc.backward(m(torch.ones(3, 4)).sum()); o.step(); s.step(); o.zero_grad()
        acc.save_state(None if auto else d)
    else:
        acc.load_state(None if auto else d)
        out["step"] = float(o.state_dict()["state"][0]["step"])
        out["last_epoch"] = s.state_dict()["last_epoch"]
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _run(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN), *args],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def saved_twice(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """The directory ``first`` then ``second`` saved into (each save its own process), made
    once per pair: both readers of a pair read the same two saves (each test a copy)."""
    made: dict[tuple[str, str], Path] = {}

    def get(first: str, second: str) -> Path:
        if (first, second) not in made:
            d = tmp_path_factory.mktemp(f"{first}-then-{second}") / "state"
            assert _run(str(d), first, "1", "save") == {}
            assert _run(str(d), second, "5", "save") == {}
            made[first, second] = d
        return made[first, second]

    return get


@pytest.mark.parametrize(
    ("first", "second", "reader"),
    [("native", "sp", "native"), ("native", "sp", "sp"), ("sp", "native", "sp"),
     ("sp", "native", "native")],
)  # fmt: skip
def test_the_newest_save_into_one_directory_is_read(
    saved_twice: Callable[[str, str], Path], tmp_path: Path, first: str, second: str, reader: str
) -> None:
    d = str(tmp_path / "state")
    shutil.copytree(saved_twice(first, second), d)
    if second == "sp":
        left = sorted(os.listdir(d))
        assert not [n for n in left if n.endswith((".pkl", ".bin"))], left
    assert _run(d, reader, "0", "load") == {"step": 5.0, "last_epoch": 5}


def test_one_line_added_to_an_automatic_naming_run(tmp_path: Path) -> None:
    d = str(tmp_path / "proj")
    assert _run(d, "native", "2", "save", "auto") == {}  # accelerate's own checkpoint_0
    before = sorted(os.listdir(os.path.join(d, "checkpoints/checkpoint_0")))
    # a new ShardpointAccelerator starts at iteration 0, as accelerate's own does: refused
    # as accelerate refuses it, the complete checkpoint kept
    got = _run(d, "sp", "1", "save", "auto")
    assert (
        got["error"].startswith("ValueError: Checkpoint directory")
        and "already exists" in got["error"]
    )
    assert sorted(os.listdir(os.path.join(d, "checkpoints/checkpoint_0"))) == before
    # and it resumes accelerate's newest checkpoint itself
    assert _run(d, "sp", "0", "load", "auto") == {"step": 2.0, "last_epoch": 2}
