"""The next script on a checkpoint whose ``.index`` file is gone while its data shards are
still there (a save killed before its commit, a copy or upload that left the index out, a
cleanup that deleted it), in fresh processes whose script never names shardpoint.

Before this round each framework's own loader answered with words that never said shardpoint
or what was missing: transformers' ``from_pretrained`` "Error no file named
model.safetensors", a plain ``Trainer``'s resume "Can't find a valid checkpoint", accelerate's
``load_state`` "No such file or directory: '.../optimizer.bin'" and ``load_checkpoint_in_model``
"is not a folder containing a `.index.json` file", ``torch.load`` of a prefix "No such file or
directory", and of a directory (and Lightning's ``load_from_checkpoint``) "Is a directory".
Now each names the checkpoint and its missing index with shardpoint's error, of a class the
framework's callers already catch: ``NotFoundError`` (a ``FileNotFoundError``) where the
framework raised an ``OSError``, ``CorruptCheckpointError`` (a ``ValueError``) where it raised
a ``ValueError``. A checkpoint whose weights are whole beside the lost index (a
``ShardpointTrainer`` checkpoint's ``model.safetensors``) still loads, and resumes the same;
a lost data shard was already named by shardpoint's reader (kept). Real transformers and
accelerate, tiny models, CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from integration_helpers.common import TESTS, run_child  # noqa: E402

#: the next script: each call of a list, its outcome as the class names of what it raised
#: (the MRO, so a test can ask "is it also an OSError?") and the first line of its message
PROBE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch


def call(kind, path):
    if kind == "from_pretrained":
        from transformers import GPT2LMHeadModel
        return type(GPT2LMHeadModel.from_pretrained(path)).__name__
    if kind == "auto":
        from transformers import AutoModelForCausalLM
        return type(AutoModelForCausalLM.from_pretrained(path)).__name__
    if kind == "torch.load":
        return sorted(torch.load(path, map_location="cpu"))
    if kind == "load_checkpoint_in_model":
        from accelerate import load_checkpoint_in_model
        from torch import nn
        # accel_run's model
        model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.2), nn.Tanh(), nn.Linear(32, 1))
        load_checkpoint_in_model(model, path)
        return float(model[0].weight.sum())
    raise ValueError(kind)


out = {}
for label, kind, path in json.loads(sys.argv[1]):
    try:
        out[label] = {"ok": call(kind, path)}
    except Exception as e:
        out[label] = {"mro": [c.__name__ for c in type(e).__mro__], "msg": str(e).splitlines()[0]}
print(json.dumps(out))
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env.update(extra or {})
    return env


def probe(calls: list[tuple[str, str, Path]], env: dict[str, str] | None = None) -> Any:
    """Run the calls in one fresh process (never importing shardpoint itself)."""
    spec = json.dumps([[label, kind, str(path)] for label, kind, path in calls])
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, spec],
        capture_output=True,
        text=True,
        env=_env(env),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def lose(src: Path, dst: Path, pattern: str) -> Path:
    """A copy of checkpoint ``src`` at ``dst`` without the files matching ``pattern``."""
    shutil.copytree(src, dst)
    gone = list(dst.rglob(pattern))
    assert gone, pattern
    for f in gone:
        f.unlink()
    return dst


def failed_resume(module: str, out: Path, steps: str, ck: Path) -> str:
    """The last line of the error of a plain framework's resume from ``ck`` (a fresh process
    that must fail)."""
    with pytest.raises(AssertionError) as err:
        run_child(module, "native", str(out), steps, str(ck))
    return str(err.value).strip().splitlines()[-1]


def assert_names_lost_index(got: dict[str, Any], where: Path, index: str, cls: str) -> None:
    assert "mro" in got, got  # it loaded: wrong, nothing could be read
    assert got["mro"][0] == cls, got
    assert "CheckpointError" in got["mro"], got
    msg = got["msg"]
    assert str(where) in msg and "is a shardpoint checkpoint" in msg, msg
    assert f"{index}' is missing" in msg and "data shards" in msg, msg


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ShardpointTrainer (weights as safetensors, and compressed) and ShardpointAccelerator
    (likewise) checkpoints, a prefix ``shardpoint.torch.save`` wrote, and the directory form
    (``<dir>/state.index``) of earlier Lightning plugins."""
    import shardpoint.torch as sptorch
    from shardpoint.integrations._state import part_prefix, save_tree

    base = tmp_path_factory.mktemp("lost-index")
    run_child(
        "hf_run", "shardpoint", str(base / "hf"), "3", ";",
        "shardpoint-compressed", str(base / "hfc"), "3",
    )  # fmt: skip
    run_child(
        "accel_run", "shardpoint", str(base / "acc"), "1", ";",
        "shardpoint-compressed", str(base / "accc"), "1",
    )  # fmt: skip
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    sptorch.save(state, str(base / "pre" / "ck"))
    sptorch.save(state, str(base / "pre2" / "ck"), shards=2)
    (base / "ldir" / "epoch=1.ckpt").mkdir(parents=True)
    save_tree(
        {"state_dict": state, "epoch": 1},
        part_prefix(base / "ldir" / "epoch=1.ckpt", "state"),
        integration="lightning",
    )
    return base


def test_from_pretrained_of_compressed_weights_names_the_lost_index(
    runs: Path, tmp_path: Path
) -> None:
    ck = lose(runs / "hfc" / "checkpoint-3", tmp_path / "ck", "shardpoint.index")
    got = probe(
        [("concrete", "from_pretrained", ck), ("auto", "auto", ck),
         ("intact", "auto", runs / "hfc" / "checkpoint-3")]
    )  # fmt: skip
    assert got["intact"] == {"ok": "GPT2LMHeadModel"}
    for label in ("concrete", "auto"):
        # was OSError "Error no file named model.safetensors, or pytorch_model.bin, found ..."
        assert_names_lost_index(got[label], ck, "shardpoint.index", "NotFoundError")
        assert "OSError" in got[label]["mro"], got[label]  # what transformers' callers catch


def test_whole_weights_beside_a_lost_index_still_load_and_resume_the_same(
    runs: Path, tmp_path: Path
) -> None:
    """``model.safetensors`` is whole: from_pretrained and a plain Trainer's resume (its
    optimizer.pt... are shardpoint single files) read it as before the index was lost."""
    ck = lose(runs / "hf" / "checkpoint-3", tmp_path / "ck", "shardpoint.index")
    got = probe([("concrete", "from_pretrained", ck), ("auto", "auto", ck)])
    assert got == {"concrete": {"ok": "GPT2LMHeadModel"}, "auto": {"ok": "GPT2LMHeadModel"}}
    intact, lost = run_child(
        "hf_run", "native", str(tmp_path / "r1"), "6", str(runs / "hf" / "checkpoint-3"), ";",
        "native", str(tmp_path / "r2"), "6", str(ck),
    )  # fmt: skip
    assert lost["losses"] == intact["losses"] and lost["digest"] == intact["digest"]


def test_a_plain_trainer_resume_names_the_lost_index(runs: Path, tmp_path: Path) -> None:
    ck = lose(runs / "hfc" / "checkpoint-3", tmp_path / "ck", "shardpoint.index")
    last = failed_resume("hf_run", tmp_path / "r", "6", ck)
    # was ValueError "Can't find a valid checkpoint at ..."; still a ValueError
    assert last.startswith("shardpoint.errors.CorruptCheckpointError: Trainer resume:"), last
    assert f"{str(ck)!r} is a shardpoint checkpoint" in last, last
    assert "shardpoint.index' is missing" in last, last
    from shardpoint.errors import CorruptCheckpointError

    assert issubclass(CorruptCheckpointError, ValueError)


@pytest.mark.parametrize("kind", ["acc", "accc"])
def test_a_plain_accelerator_load_state_names_the_lost_index(
    runs: Path, tmp_path: Path, kind: str
) -> None:
    ck = lose(runs / kind / "checkpoints" / "checkpoint_0", tmp_path / "ck", "shardpoint.index")
    last = failed_resume("accel_run", tmp_path / "r", "2", ck)
    # was FileNotFoundError "No such file or directory: '.../optimizer.bin'" (or
    # pytorch_model.bin); NotFoundError is still one
    assert last.startswith("shardpoint.errors.NotFoundError: Accelerator.load_state:"), last
    assert f"{str(ck)!r} is a shardpoint checkpoint" in last, last
    assert "shardpoint.index' is missing" in last, last


def test_load_checkpoint_in_model_names_the_lost_index(runs: Path, tmp_path: Path) -> None:
    src = runs / "accc" / "checkpoints" / "checkpoint_0"
    ck = lose(src, tmp_path / "ck", "shardpoint.index")
    got = probe(
        [("lost", "load_checkpoint_in_model", ck), ("intact", "load_checkpoint_in_model", src)]
    )
    assert "ok" in got["intact"], got["intact"]
    # was ValueError "... is not a folder containing a `.index.json` file or ..."
    assert_names_lost_index(got["lost"], ck, "shardpoint.index", "CorruptCheckpointError")
    assert "ValueError" in got["lost"]["mro"]


def test_torch_load_of_a_prefix_or_directory_names_the_lost_index(
    runs: Path, tmp_path: Path
) -> None:
    pre = lose(runs / "pre", tmp_path / "pre", "*.index") / "ck"
    ldir = lose(runs / "ldir", tmp_path / "ldir", "*.index") / "epoch=1.ckpt"
    calls = [
        ("prefix", "torch.load", pre),
        ("index", "torch.load", Path(f"{pre}.index")),
        ("directory", "torch.load", ldir),
        ("intact", "torch.load", runs / "pre" / "ck"),
        ("elsewhere", "torch.load", tmp_path / "nothing.pt"),
    ]
    got = probe(calls)
    assert got["intact"] == {"ok": ["b", "w"]}
    # torch's own error for a path that is nobody's checkpoint, unchanged
    assert got["elsewhere"]["mro"][0] == "FileNotFoundError", got["elsewhere"]
    # were torch's FileNotFoundError "No such file or directory" / IsADirectoryError
    assert_names_lost_index(got["prefix"], pre, "ck.index", "NotFoundError")
    assert_names_lost_index(got["index"], Path(f"{pre}.index"), "ck.index", "NotFoundError")
    assert_names_lost_index(got["directory"], ldir, "state.index", "NotFoundError")
    for label in ("prefix", "index", "directory"):
        assert "FileNotFoundError" in got[label]["mro"], got[label]
    # the reading turned off: torch's own error, as for every file of ours then
    off = probe(calls[:1], env={"SHARDPOINT_TORCH_LOAD": "0"})
    assert off["prefix"]["mro"][0] == "FileNotFoundError", off


def test_a_lost_index_is_named_when_shard_zero_is_lost_too(runs: Path, tmp_path: Path) -> None:
    """Any data shard left beside the lost index marks the checkpoint as ours, not only the
    first (a copy that stopped early may have left only the later ones)."""
    assert sorted(p.name for p in (runs / "pre2").iterdir()) == [
        "ck.data-00000-of-00002",
        "ck.data-00001-of-00002",
        "ck.index",
    ]
    pre = lose(runs / "pre2", tmp_path / "pre2", "*.index") / "ck"
    (pre.parent / "ck.data-00000-of-00002").unlink()
    assert sorted(p.name for p in pre.parent.iterdir()) == ["ck.data-00001-of-00002"]
    got = probe([("prefix", "torch.load", pre)])
    assert_names_lost_index(got["prefix"], pre, "ck.index", "NotFoundError")


def test_a_lost_data_shard_was_already_named_by_shardpoint(runs: Path, tmp_path: Path) -> None:
    """Kept as it was: the index names the shard, and shardpoint's reader says it is gone."""
    pre = lose(runs / "pre", tmp_path / "pre", "*.data-*") / "ck"
    hfc = lose(runs / "hfc" / "checkpoint-3", tmp_path / "hfc", "*.data-*")
    got = probe([("prefix", "torch.load", pre), ("from_pretrained", "auto", hfc)])
    for label, where in (("prefix", f"{pre}.data-00000-of-00001"),
                         ("from_pretrained", f"{hfc}/shardpoint.data-00000-of-00001")):  # fmt: skip
        assert got[label]["mro"][0] == "NotFoundError", got[label]
        assert got[label]["msg"].startswith(f"{where}: not found"), got[label]


def test_lightning_load_from_checkpoint_of_the_directory_form_names_the_lost_index(
    runs: Path, tmp_path: Path
) -> None:
    pytest.importorskip("lightning")
    ck = lose(runs / "ldir", tmp_path / "ldir", "*.index") / "epoch=1.ckpt"
    script = (
        "import sys, torch, lightning as L\n"
        "class M(L.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.w = torch.nn.Parameter(torch.zeros(2, 3))\n"
        "M.load_from_checkpoint(sys.argv[1], map_location='cpu')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(ck)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    last = proc.stderr.strip().splitlines()[-1]
    # was IsADirectoryError "[Errno 21] Is a directory: '.../epoch=1.ckpt'"
    assert proc.returncode != 0 and last.startswith("shardpoint.errors.NotFoundError:"), last
    assert str(ck / "state") in last and "state.index' is missing" in last, last
