"""numpy arrays that view one buffer: ``save_file`` records how they overlap and ``load_file``
hands them back as views of one buffer (as ``shardpoint.torch.save`` keeps tensors that share
a storage); every value still reads on its own; a forged section is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.storage.numpy_views import SECTION, plan_views


def _tree() -> dict[str, np.ndarray]:
    a = np.arange(40, dtype=np.float32)
    return {
        "a": a,
        "head": a[:8],
        "rev": a[::-3],
        "col": a.reshape(8, 5)[:, 2],
        "other": np.ones(6, np.float64),  # unrelated: never aliased
        "b16": np.arange(12, dtype=np.int16).reshape(3, 4).T,  # a transposed view alone
    }


@pytest.mark.parametrize("name", ["ck", "ck.pt"], ids=["prefix", "single-file"])
def test_views_of_one_buffer_load_as_views(tmp_path: Path, name: str) -> None:
    tree = _tree()
    sp.save_file(tree, tmp_path / name)
    out = sp.load_file(tmp_path / name)
    for k, v in tree.items():
        assert out[k].dtype == v.dtype and np.array_equal(out[k], v), k
    assert np.shares_memory(out["a"], out["head"])
    assert np.shares_memory(out["a"], out["rev"]) and np.shares_memory(out["a"], out["col"])
    assert not np.shares_memory(out["other"], out["a"])
    out["a"][:] = -1  # a write through one member shows through the others, as before the save
    assert (out["head"] == -1).all() and (out["rev"] == -1).all() and (out["col"] == -1).all()
    with sp.open(tmp_path / name) as r:  # a Reader (and any older reader) reads each whole
        assert np.array_equal(r["rev"], tree["rev"])
        assert set(r.sections) == {SECTION}


def test_agrees_with_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from shardpoint import torch as sptorch

    t = torch.arange(10.0)
    sptorch.save({"t": t, "v": t[2:5]}, tmp_path / "t")
    back = sptorch.load(tmp_path / "t")
    a = np.arange(10.0)
    sp.save_file({"t": a, "v": a[2:5]}, tmp_path / "n")
    nback = sp.load_file(tmp_path / "n")
    back["t"][3] = 99
    nback["t"][3] = 99
    assert back["v"][1].item() == nback["v"][1] == 99


def test_keys_subset_and_copy(tmp_path: Path) -> None:
    tree = _tree()
    sp.save_file(tree, tmp_path / "ck")
    sub = sp.load_file(tmp_path / "ck", keys=["head", "rev"])
    assert sorted(sub) == ["head", "rev"]
    assert np.shares_memory(sub["head"], sub["rev"])
    assert np.array_equal(sub["rev"], tree["rev"])
    private = sp.load_file(tmp_path / "ck", copy=True)
    assert np.shares_memory(private["a"], private["col"])


def test_nothing_recorded_without_overlap(tmp_path: Path) -> None:
    a = np.arange(10)
    assert plan_views({"x": a[:5], "y": a[5:], "z": np.zeros(3)}) is None
    sparse = np.zeros(1 << 22, np.uint8)  # two bytes 4 MiB apart: saved unaliased
    assert plan_views({"p": sparse[:1], "q": sparse[:: -(1 << 22) + 1]}) is None
    sp.save_file({"x": a[:5], "y": a[5:]}, tmp_path / "ck")
    with sp.open(tmp_path / "ck") as r:
        assert r.sections == {}


@pytest.mark.parametrize(
    "forged, message",
    [
        ({"groups": [{"nbytes": 1 << 40, "members": {"a": {"offset": 0, "strides": [4]}, "b": {"offset": 0, "strides": [4]}}}]}, "more than its members"),
        ({"groups": [{"nbytes": 16, "members": {"a": {"offset": 12, "strides": [4]}, "b": {"offset": 0, "strides": [4]}}}]}, "does not fit"),
        ({"groups": [{"nbytes": 16, "members": {"a": {"offset": "0", "strides": [4]}, "b": {"offset": 0, "strides": [4]}}}]}, "malformed"),
        ({"groups": [{"nbytes": 16, "members": {"a": {"offset": 0, "strides": [4]}, "zz": {"offset": 0, "strides": [4]}}}]}, "missing key"),
        ({"groups": "x"}, "not a list"),
    ],
    ids=["huge-span", "out-of-span", "malformed", "missing-key", "not-a-list"],
)  # fmt: skip
def test_forged_section_is_refused(tmp_path: Path, forged: object, message: str) -> None:
    vals = {"a": np.arange(4, dtype=np.float32), "b": np.arange(4, dtype=np.float32)}
    sp.save_file(vals, tmp_path / "ck", _sections={SECTION: forged})
    with pytest.raises(sp.CorruptCheckpointError, match=message):
        sp.load_file(tmp_path / "ck")
    with sp.open(tmp_path / "ck") as r:  # the values themselves are intact
        assert np.array_equal(r["a"], vals["a"])
