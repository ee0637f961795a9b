"""Every writer creates the missing parent directories of its destination (as TensorFlow's
``Checkpoint.save`` and Orbax do), and an error names the user's path, never a temp file."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

import shardpoint as sp


def _save_file(dst: str) -> None:
    sp.save_file({"a": np.arange(3.0)}, dst)


def _save_incremental(dst: str) -> None:
    sp.save_file({"a": np.arange(3.0)}, dst, incremental=True)


def _save_async(dst: str) -> None:
    fut = sp.save_file({"a": np.arange(3.0)}, dst, blocking=False)
    assert fut is not None
    fut.result()


def _writer(dst: str) -> None:
    with sp.Writer(dst) as w:
        w.add("a", np.arange(3.0))


def _multi_writer(dst: str) -> None:
    for rank in range(2):
        w = sp.Writer(dst, rank=rank, world_size=2)
        w.add(f"a{rank}", np.arange(3.0))
        w.commit()
    sp.merge(dst, 2)


def _sptorch_save(dst: str) -> None:
    torch = pytest.importorskip("torch")
    import shardpoint.torch as sptorch

    sptorch.save({"a": torch.ones(3)}, dst)


def _save_model(dst: str) -> None:
    torch = pytest.importorskip("torch")
    import shardpoint.torch as sptorch

    sptorch.save_model(torch.nn.Linear(2, 2), dst)


def _spj_save(dst: str) -> None:
    jnp = pytest.importorskip("jax.numpy")
    import shardpoint.jax as spj

    spj.save({"a": jnp.ones(3)}, dst)


def _checkpoint_save(dst: str) -> None:
    sp.Checkpoint(v=sp.Variable(1.0)).write(dst)


def _manager(dst: str) -> None:
    sp.CheckpointManager(sp.Checkpoint(v=sp.Variable(1.0)), dst, max_to_keep=1).save()


WRITERS: dict[str, Callable[[str], None]] = {
    "save_file": _save_file,
    "save_file_incremental": _save_incremental,
    "save_file_async": _save_async,
    "Writer": _writer,
    "Writer_multi": _multi_writer,
    "sptorch.save": _sptorch_save,
    "sptorch.save_model": _save_model,
    "spj.save": _spj_save,
    "Checkpoint.write": _checkpoint_save,
    "CheckpointManager": _manager,
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_writers_create_missing_parents(name: str, tmp_path: pathlib.Path) -> None:
    dst = str(tmp_path / "not" / "yet" / "there" / "ck")
    WRITERS[name](dst)
    if name == "CheckpointManager":
        assert sp.latest_checkpoint(dst) is not None
    else:
        assert sp.exists(dst) and sp.open(dst).keys()


def test_export_hf_and_cli_convert_create_missing_parents(tmp_path: pathlib.Path) -> None:
    src = str(tmp_path / "src" / "ck")
    sp.save_file({"w": np.ones((2, 2), np.float32)}, src)
    out = tmp_path / "a" / "b" / "hf"
    sp.export_hf(src, out)
    assert (out / "model.safetensors").exists()
    for args, made in [
        ([src, str(tmp_path / "c" / "d" / "ck")], tmp_path / "c" / "d" / "ck.index"),
        (["--to", "hf", src, str(tmp_path / "e" / "f" / "hf")], tmp_path / "e" / "f" / "hf"),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "shardpoint", "convert", *args], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        assert made.exists()


def test_errors_name_the_users_directory_not_a_temp_file(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for save in (_save_file, _writer, _save_incremental):
        with pytest.raises(sp.CheckpointIOError) as e:
            save(str(blocker / "sub" / "ck"))
        assert str(blocker / "sub") in str(e.value) and ".tmp-" not in str(e.value)
    src = str(tmp_path / "src")
    sp.save_file({"w": np.ones(2, np.float32)}, src)
    with pytest.raises(sp.CheckpointIOError, match="destination directory") as e:
        sp.export_hf(src, str(blocker / "sub" / "hf"))
    assert str(blocker / "sub") in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["file", "src.data-00000-of-00001", "src.index"]


def test_single_file_save_creates_parents(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    import shardpoint.torch as sptorch

    f = tmp_path / "a" / "b" / "model.pt"  # the single-file form (FORMAT.md §10)
    sptorch.save({"w": torch.ones(2)}, str(f))
    assert f.is_file() and torch.equal(sptorch.load(str(f))["w"], torch.ones(2))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(sp.CheckpointIOError) as e:
        sptorch.save({"w": torch.ones(2)}, str(blocker / "model.pt"))
    assert str(blocker) in str(e.value) and ".tmp-" not in str(e.value)
