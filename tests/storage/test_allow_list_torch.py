"""The allow-list of object types is the user's, however they gave it: a class allowed for
torch's ``weights_only`` loads (``torch.serialization.add_safe_globals`` or its
``safe_globals`` context) is built by shardpoint's loads too, read at load time and only
when torch is imported already; and a save of a type no load would build says so once, at
save time (``UnregisteredTypeWarning``), instead of failing at resume time."""

from __future__ import annotations

import dataclasses
import enum
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import shardpoint as sp
from shardpoint.errors import UnregisteredTypeError, UnregisteredTypeWarning

torch = pytest.importorskip("torch")


@dataclasses.dataclass
class TorchAllowedConfig:
    lr: float
    layers: tuple[int, ...]


class TorchAllowedMode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclasses.dataclass
class WarnedOnce:
    step: int


@dataclasses.dataclass
class RegisteredBeforeSave:
    step: int


def _saved(tmp_path: Path, value: object, name: str = "ck") -> str:
    prefix = str(tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnregisteredTypeWarning)
        sp.save_file({"obj": value}, prefix, durable=False)
    return prefix


def test_a_type_allowed_in_torchs_safe_globals_context_loads(tmp_path: Path) -> None:
    prefix = _saved(tmp_path, {"cfg": TorchAllowedConfig(1e-3, (4, 8))})
    with pytest.raises(UnregisteredTypeError, match="TorchAllowedConfig"):
        sp.load_file(prefix)
    with torch.serialization.safe_globals([TorchAllowedConfig]):
        got = sp.load_file(prefix)["obj"]
    assert got == {"cfg": TorchAllowedConfig(1e-3, (4, 8))}
    # the context is over: torch forgot the class, and so do we
    with pytest.raises(UnregisteredTypeError):
        sp.load_file(prefix)


def test_an_enum_allowed_under_an_explicit_name_loads(tmp_path: Path) -> None:
    prefix = _saved(tmp_path, [TorchAllowedMode.EVAL, TorchAllowedMode.TRAIN])
    name = f"{__name__}.TorchAllowedMode"
    with torch.serialization.safe_globals([(TorchAllowedMode, name)]):
        assert sp.load_file(prefix)["obj"] == [TorchAllowedMode.EVAL, TorchAllowedMode.TRAIN]


def test_a_save_of_an_unloadable_type_warns_once_naming_the_call(tmp_path: Path) -> None:
    with pytest.warns(UnregisteredTypeWarning) as caught:
        sp.save_file({"a": WarnedOnce(1)}, str(tmp_path / "a"), durable=False)
    text = str(caught[0].message)
    assert "shardpoint.add_safe_types([WarnedOnce])" in text
    assert "torch.serialization.add_safe_globals([WarnedOnce])" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnregisteredTypeWarning)  # a second save: silent
        sp.save_file({"b": [WarnedOnce(2), WarnedOnce(3)]}, str(tmp_path / "b"), durable=False)


def test_no_warning_for_a_registered_or_torch_allowed_type(tmp_path: Path) -> None:
    sp.register_type(RegisteredBeforeSave)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnregisteredTypeWarning)
        sp.save_file({"a": RegisteredBeforeSave(1)}, str(tmp_path / "a"), durable=False)
        with torch.serialization.safe_globals([TorchAllowedMode]):
            sp.save_file({"b": TorchAllowedMode.TRAIN}, str(tmp_path / "b"), durable=False)
    assert sp.load_file(str(tmp_path / "a"))["a"] == RegisteredBeforeSave(1)


_MODULE = """
import dataclasses

@dataclasses.dataclass
class RunState:
    step: int
    tag: str
"""

_SAVE = """
import sys
sys.path.insert(0, sys.argv[1])
import shardpoint as sp
from runstate_mod import RunState
sp.save_file({"state": RunState(7, "x")}, sys.argv[2], durable=False)
"""

_LOAD = """
import sys
sys.path.insert(0, sys.argv[1])
import shardpoint as sp
from runstate_mod import RunState
try:
    sp.load_file(sys.argv[2])
except sp.UnregisteredTypeError:
    print("refused; torch imported:", "torch" in sys.modules)
import torch
torch.serialization.add_safe_globals([RunState])
print("loaded", sp.load_file(sys.argv[2])["state"])
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="default")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )


def test_fresh_processes_save_warns_and_load_after_add_safe_globals(tmp_path: Path) -> None:
    (tmp_path / "runstate_mod.py").write_text(_MODULE)
    prefix = str(tmp_path / "ck")
    saved = _run(_SAVE, str(tmp_path), prefix)
    assert "UnregisteredTypeWarning" in saved.stderr
    assert "shardpoint.add_safe_types([RunState])" in saved.stderr
    loaded = _run(_LOAD, str(tmp_path), prefix)
    lines = loaded.stdout.splitlines()
    # before torch is imported its list is not read, and reading it never imports torch
    assert lines[0] == "refused; torch imported: False"
    assert lines[1] == "loaded RunState(step=7, tag='x')"


@dataclasses.dataclass
class WarnedAtCaller:
    step: int


def test_the_warning_points_at_the_callers_save(tmp_path: Path) -> None:
    with pytest.warns(UnregisteredTypeWarning) as caught:
        sp.save_file({"a": {"nested": [WarnedAtCaller(1)]}}, str(tmp_path / "a"), durable=False)
    assert caught[0].filename == __file__


_TORCH_LOAD = """
import pickle, sys
sys.path.insert(0, sys.argv[1])
import torch
try:
    torch.load(sys.argv[2], weights_only=True)
except pickle.UnpicklingError as e:  # what torch raises for a global it does not allow
    print(type(e).__name__, "|", e)
"""


def test_torch_load_of_an_unallowed_type_raises_what_torch_raises_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    # the next script's habit: `except pickle.UnpicklingError` around torch.load, and torch's
    # own words ("Unsupported global: GLOBAL <name>") in the message, as its tests match them
    (tmp_path / "runstate_mod.py").write_text(_MODULE)
    prefix = str(tmp_path / "ck")
    _run(_SAVE, str(tmp_path), prefix)
    out = _run(_TORCH_LOAD, str(tmp_path), prefix + ".index").stdout
    name, _, message = out.partition(" | ")
    assert name == "UnregisteredTypeError"
    assert "Unsupported global: GLOBAL runstate_mod.RunState" in message
    assert repr(prefix) in message and "shardpoint.add_safe_types" in message  # names it
