"""``training_args.bin`` of a ``ShardpointTrainer`` checkpoint read by the user's next script:
``torch.load`` in a fresh process that never imports shardpoint gives the ``TrainingArguments``
object Trainer pickles there (before: a dict of its fields, and ``args.learning_rate`` failed
with "'dict' object has no attribute" — an error that never said shardpoint).

Each read runs in a new interpreter, beside ``torch.load`` of Trainer's own pickle of the same
arguments; a user subclass is found by the allow-list or, with ``weights_only=False``, by its
module, as torch finds it; a class refusing the fields comes back as the dict, with a warning
naming the file. Real transformers, CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from transformers import TrainingArguments  # noqa: E402

from shardpoint.integrations._hf_args import RECORD  # noqa: E402
from shardpoint.integrations._hf_files import save_args  # noqa: E402
from shardpoint.integrations._state import save_tree  # noqa: E402

#: the next script: loads each (path, kwargs, preamble) and prints what it got, as JSON
NEXT = """
import json, sys, warnings
import torch
out = []
for path, kwargs, pre in json.loads(sys.argv[1]):
    exec(pre)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if path.startswith("fileobj:"):
            with open(path[8:], "rb") as fh:
                got = torch.load(fh, **kwargs)
        else:
            got = torch.load(path, **kwargs)
    fields = got if isinstance(got, dict) else got.to_dict()
    out.append({
        "type": f"{type(got).__module__}.{type(got).__qualname__}",
        "fields": json.loads(json.dumps(fields, default=str)),
        "extra": getattr(got, "my_flag", None),
        "world_size": None if isinstance(got, dict) else got.world_size,
        "strategy": None if isinstance(got, dict) else type(got.eval_strategy).__name__,
        "warnings": [str(w.message) for w in caught if "shardpoint" in str(w.message)],
        "where": [w.filename for w in caught if "shardpoint" in str(w.message)],
    })
print(json.dumps(out))
"""

SUBCLASS = """
from dataclasses import dataclass, field
from transformers import TrainingArguments

@dataclass
class MyArgs(TrainingArguments):
    my_flag: int = field(default=3)
"""


def _next_script(reads: list[tuple[str, dict[str, Any], str]], pythonpath: Path) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, "-c", NEXT, json.dumps(reads)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: list[dict] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _args(cls: type = TrainingArguments, **kw: Any) -> Any:
    return cls(
        "out",
        learning_rate=3e-4,
        eval_strategy="steps",
        lr_scheduler_type="cosine",
        save_steps=7,
        report_to="none",
        hub_token="secret-token",
        accelerator_config={"split_batches": True},
        **kw,
    )


@pytest.fixture
def sub(tmp_path: Path) -> Iterator[Any]:
    """A user's ``TrainingArguments`` subclass, importable by the next script."""
    (tmp_path / "myargs.py").write_text(textwrap.dedent(SUBCLASS))
    sys.path.insert(0, str(tmp_path))
    try:
        import myargs

        yield myargs.MyArgs
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("myargs", None)


def test_next_script_gets_trainings_arguments_object(tmp_path: Path) -> None:
    args = _args()
    ours, nat = tmp_path / "ours", tmp_path / "native"
    nat.mkdir()
    save_args(args, str(ours), integration="hf_trainer")
    torch.save(args, nat / "training_args.bin")  # what Trainer does
    p, n = str(ours / "training_args.bin"), str(nat / "training_args.bin")
    got = _next_script(
        [
            (p, {"weights_only": False}, ""),
            (p, {}, ""),  # torch's default, weights_only=True: transformers' own class only
            ("fileobj:" + p, {"weights_only": False, "map_location": "cpu"}, ""),
            (n, {"weights_only": False}, ""),
        ],
        tmp_path,
    )
    native = got[-1]
    assert native["type"] == "transformers.training_args.TrainingArguments"
    for g in got[:-1]:
        assert g["type"] == native["type"] and g["warnings"] == []
        assert g["fields"] == native["fields"]  # to_dict masks the token on both sides
        assert g["world_size"] == native["world_size"] == 1
        assert g["strategy"] == native["strategy"] == "IntervalStrategy"
    assert got[0]["fields"]["learning_rate"] == 3e-4
    assert got[0]["fields"]["accelerator_config"]["split_batches"] is True
    # the token itself is not stored (it comes back None, where Trainer's pickle keeps it)
    assert b"secret-token" not in (ours / "training_args.bin").read_bytes()
    assert b"secret-token" in (nat / "training_args.bin").read_bytes()


def test_a_user_subclass_is_built_when_trusted_or_allowed(tmp_path: Path, sub: Any) -> None:
    save_args(_args(sub, my_flag=7), str(tmp_path), integration="hf_trainer")
    p = str(tmp_path / "training_args.bin")
    allow = "import myargs; torch.serialization.add_safe_globals([myargs.MyArgs])"
    trusted, plain, allowed = _next_script(  # allowed last: add_safe_globals stays
        [(p, {"weights_only": False}, ""), (p, {}, ""), (p, {}, allow)], tmp_path
    )
    for g in (trusted, allowed):
        assert g["type"] == "myargs.MyArgs" and g["extra"] == 7 and g["warnings"] == []
    # not allowed, not trusted: never imported by a name read from the file; built as its
    # nearest allowed base, the extra field kept as an attribute, and told how to allow it
    assert plain["type"] == "transformers.training_args.TrainingArguments"
    assert plain["extra"] == 7
    (warning,) = plain["warnings"]
    assert "myargs.MyArgs" in warning and "add_safe_globals([MyArgs])" in warning
    assert plain["where"] == ["<string>"]  # said at the user's torch.load, in their script
    assert plain["fields"]["learning_rate"] == 3e-4


def test_fields_the_class_refuses_come_back_as_a_dict_with_a_warning(tmp_path: Path) -> None:
    fields = json.loads(_args().to_json_string())
    fields["eval_strategy"] = "every-full-moon"  # IntervalStrategy(...) raises
    p = str(tmp_path / "training_args.bin")
    record = {"class": "transformers.training_args.TrainingArguments", "bases": []}
    save_tree(fields, p, integration="hf_trainer", single_file=True, metadata={RECORD: record})
    hostile = str(tmp_path / "hostile.bin")  # a record naming a class that is no arguments
    save_tree(
        json.loads(_args().to_json_string()),
        hostile,
        integration="hf_trainer",
        single_file=True,
        metadata={RECORD: {"class": "subprocess.Popen", "bases": ["os.PathLike"]}},
    )
    odd = str(tmp_path / "odd.bin")  # a record whose bases are no list
    save_tree(
        json.loads(_args().to_json_string()),
        odd,
        integration="hf_trainer",
        single_file=True,
        metadata={RECORD: {"class": 7, "bases": 5}},
    )
    refused, named, unnamed = _next_script(
        [(p, {"weights_only": False}, ""), (hostile, {"weights_only": False}, ""), (odd, {}, "")],
        tmp_path,
    )
    assert unnamed["type"] == "builtins.dict" and unnamed["warnings"] == []  # the tree as stored
    assert refused["type"] == named["type"] == "builtins.dict"
    assert refused["fields"]["eval_strategy"] == "every-full-moon"
    (warning,) = refused["warnings"]
    assert "training_args.bin" in warning and "every-full-moon" in warning
    assert refused["where"] == ["<string>"]
    (warning,) = named["warnings"]
    assert "hostile.bin" in warning and "subprocess.Popen" in warning
