"""Reader.load_into: decoding straight into existing arrays (issue 15's load path without
fresh memory), its checks, and its crc checking."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import shardpoint as sp
from shardpoint.errors import ChecksumMismatchError, InvalidArgumentError


def _state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w = (rng.standard_normal((300, 700)) * 0.02).astype(np.float32)
    return {
        "w32": w,
        "w16": w.astype(np.float16),
        "wbf": w.astype(ml_dtypes.bfloat16),
        "i64": rng.integers(-5, 5, size=(1000,)).astype(np.int64),
        "small": np.arange(7, dtype=np.float32),
    }


@pytest.mark.parametrize("compression", ["bytegroup-huffman", "zstd-bytegroup", "none", "zstd"])
def test_values_land_in_the_given_arrays(tmp_path, compression):
    st = _state(np.random.default_rng(0))
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression=compression, durable=False)
    targets = {k: np.full_like(v, 3) for k, v in st.items()}
    ptrs = {k: v.ctypes.data for k, v in targets.items()}
    with sp.open(p) as r:
        r.load_into(targets)
    for k, v in st.items():
        assert targets[k].ctypes.data == ptrs[k]  # the same memory, not a replacement
        np.testing.assert_array_equal(targets[k].view(np.uint8), v.view(np.uint8))


def test_a_subset_of_keys_is_fine(tmp_path):
    st = _state(np.random.default_rng(1))
    p = str(tmp_path / "ck")
    sp.save_file(st, p, durable=False)
    t = {"w32": np.zeros((300, 700), np.float32)}
    with sp.open(p) as r:
        r.load_into(t)
    np.testing.assert_array_equal(t["w32"], st["w32"])


@pytest.mark.parametrize(
    "target, words",
    [
        (np.zeros((300, 700), np.float64), "float64"),
        (np.zeros((700, 300), np.float32), "[700, 300]"),
        (np.zeros((300, 1400), np.float32)[:, ::2], "C-contiguous"),
        ([1.0, 2.0], "numpy array"),
    ],
)
def test_bad_targets_name_the_key(tmp_path, target, words):
    p = str(tmp_path / "ck")
    sp.save_file(_state(np.random.default_rng(2)), p, durable=False)
    with sp.open(p) as r, pytest.raises(InvalidArgumentError, match=r"w32.*") as e:
        r.load_into({"w32": target})
    assert words in str(e.value)


def test_read_only_target_is_refused(tmp_path):
    p = str(tmp_path / "ck")
    sp.save_file(_state(np.random.default_rng(3)), p, durable=False)
    t = np.zeros((300, 700), np.float32)
    t.flags.writeable = False
    with sp.open(p) as r, pytest.raises(InvalidArgumentError, match="writable"):
        r.load_into({"w32": t})


def test_missing_key_raises_key_error(tmp_path):
    p = str(tmp_path / "ck")
    sp.save_file(_state(np.random.default_rng(4)), p, durable=False)
    with sp.open(p) as r, pytest.raises(KeyError):
        r.load_into({"nope": np.zeros(3, np.float32)})


def test_overlapping_targets_are_refused_by_the_core(tmp_path):
    st = {"a": np.ones(5000, np.float32), "b": np.ones(5000, np.float32)}
    p = str(tmp_path / "ck")
    sp.save_file(st, p, durable=False)
    buf = np.zeros(5000, np.float32)
    with sp.open(p) as r, pytest.raises(InvalidArgumentError, match="overlap"):
        r.load_into({"a": buf, "b": buf})


def _damage(prefix: str, key: str, at: int, mask: int) -> str:
    """Xor `mask` into byte `at` of `key`'s stored payload; returns the shard's path."""
    with sp.open(prefix) as r:
        info = r.info(key)
        path = r.format_info["shards"][info.shard][0]
    with open(path, "r+b") as f:
        f.seek(info.offset + at)
        b = f.read(1)[0]
        f.seek(info.offset + at)
        f.write(bytes([b ^ mask]))
    return path


def test_damaged_payload_is_a_checksum_error_and_files_stay(tmp_path):
    st = _state(np.random.default_rng(5))
    p = str(tmp_path / "ck")
    sp.save_file(st, p, durable=False)
    path = _damage(p, "w32", 100, 0xFF)
    before = Path(path).read_bytes()
    with sp.open(p) as r, pytest.raises(ChecksumMismatchError):
        r.load_into({"w32": np.zeros((300, 700), np.float32)})
    assert Path(path).read_bytes() == before


def test_uncompressed_values_are_checked_when_verify(tmp_path):
    st = {"w": np.arange(5000, dtype=np.float32)}
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression="none", durable=False)
    _damage(p, "w", 8, 1)
    with sp.open(p) as r:
        with pytest.raises(ChecksumMismatchError):
            r.load_into({"w": np.zeros(5000, np.float32)}, verify=True)
        t = np.zeros(5000, np.float32)
        r.load_into({"w": t}, verify=False)  # unchecked: the damaged bytes as stored
        assert t.view(np.uint8)[8] == (np.arange(5000, dtype=np.float32).view(np.uint8)[8] ^ 1)
