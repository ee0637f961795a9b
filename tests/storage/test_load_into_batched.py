"""``Reader.load_into`` with many targets: checked against the index in one core call
(``storage/targets.py``, ``first_mismatch``), with the same errors, naming the key, as the
key-by-key check it falls back to."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.storage.targets import checked_targets

_N = 400


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    out: dict[str, np.ndarray] = {
        f"v{i:04d}": rng.integers(0, 255, 96, dtype=np.uint8) for i in range(_N)
    }
    out["w32"] = rng.standard_normal((6, 7)).astype(np.float32)
    out["ints"] = np.arange(10, dtype=np.int64)
    return out


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("batched") / "ck")
    sp.save_file({**_values(), "note": "text"}, prefix, compression="none")
    return prefix


def _targets() -> dict[str, np.ndarray]:
    return {k: np.zeros_like(v) for k, v in _values().items()}


def test_many_targets_are_filled_through_the_batched_check(ck: str) -> None:
    targets = _targets()
    with sp.open(ck) as r:
        fast = checked_targets(r._core, targets)
        assert fast is not None and fast[0] == list(targets)  # the one-call path is taken
        r.load_into(targets)
    for k, v in _values().items():
        np.testing.assert_array_equal(targets[k], v, err_msg=k)


@pytest.mark.parametrize(
    "change, error, words",
    [
        (lambda t: t.__setitem__("v0399", np.zeros(95, np.uint8)), sp.InvalidArgumentError,
         r"key 'v0399': target is uint8\[95\], stored value is uint8\[96\]"),
        (lambda t: t.__setitem__("w32", np.zeros((7, 6), np.float32)), sp.InvalidArgumentError,
         r"key 'w32': target is float32\[7, 6\], stored value is float32\[6, 7\]"),
        (lambda t: t.__setitem__("w32", np.zeros((6, 7), ">f4")), sp.InvalidArgumentError,
         r"key 'w32': target is >f4\[6, 7\]"),
        (lambda t: t.__setitem__("ints", np.zeros(10, np.int32)), sp.InvalidArgumentError,
         r"key 'ints': target is int32\[10\], stored value is int64\[10\]"),
        (lambda t: t.__setitem__("note", np.zeros(4, np.uint8)), sp.InvalidArgumentError,
         r"key 'note': stored value is a str"),
        (lambda t: t.__setitem__("absent", np.zeros(4, np.uint8)), KeyError, "absent"),
        (lambda t: t.__setitem__("bad\0key", np.zeros(4, np.uint8)), sp.InvalidKeyError, "NUL"),
        (lambda t: t.__setitem__(7, np.zeros(4, np.uint8)), sp.InvalidKeyError, "must be str"),
        (lambda t: t.__setitem__("v0001", [0] * 96), sp.InvalidArgumentError, "numpy array"),
        (lambda t: t.__setitem__("w32", np.zeros((7, 6), np.float32).T), sp.InvalidArgumentError,
         "key 'w32': target must be C-contiguous"),
    ],
)  # fmt: skip
def test_a_bad_target_among_many_names_its_key(ck: str, change, error, words) -> None:
    targets = _targets()
    change(targets)
    with sp.open(ck) as r:
        assert checked_targets(r._core, targets) is None  # the batched check refuses it
        with pytest.raises(error, match=words):
            r.load_into(targets)


def test_a_short_shard_names_the_file(ck: str, tmp_path: pathlib.Path) -> None:
    """A shard cut before opening is refused at open; one cut while open (the reader has
    checked its length already) fails in the read, naming the file and the offset."""
    src = pathlib.Path(ck)
    for p in src.parent.glob(src.name + ".*"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    with sp.open(str(tmp_path / "ck")) as r:
        shard = pathlib.Path(r.format_info["shards"][0][0]).name
    short = tmp_path / shard
    half = short.stat().st_size // 2
    with sp.open(str(tmp_path / "ck"), io="pread") as r:
        with open(short, "r+b") as f:
            f.truncate(half)  # in place: the open reader's descriptor sees it
        with pytest.raises(sp.CorruptCheckpointError, match=f"{shard}.*offset"):
            r.load_into(_targets())
    with pytest.raises(sp.CorruptCheckpointError, match=shard):
        sp.open(str(tmp_path / "ck"))
