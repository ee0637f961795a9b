"""The bulk-load engine (issue 25): large values through ``Reader.load_into`` (pieces, fused
read + crc, read-ahead), Hugging Face directories loaded into existing arrays, and the
``io="mmap" | "pread" | "auto"`` choice."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file as st_save

import shardpoint as sp
from shardpoint.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    InvalidArgumentError,
)
from shardpoint.storage.io_mode import fs_type, resolve_io

# Above the engine's read-ahead threshold (16 MiB) and many 4 MiB pieces.
BIG = (5 << 20) + 123


def _state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(25)
    w = (rng.standard_normal(BIG // 2) * 0.02).astype(ml_dtypes.bfloat16)
    return {
        "big": w,
        "big2": (rng.standard_normal((1200, 1000)) * 0.02).astype(np.float32),
        "bias": rng.standard_normal(77).astype(np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }


@pytest.mark.parametrize("compression", ["none", "bytegroup-huffman"])
def test_large_values_land_whole(tmp_path, compression):
    st = _state()
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression=compression, durable=False)
    targets = {k: np.full_like(v, 7) for k, v in st.items()}
    with sp.open(p) as r:
        r.load_into(targets)
    for k, v in st.items():
        np.testing.assert_array_equal(targets[k].view(np.uint8), v.view(np.uint8))


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_a_flipped_byte_deep_in_a_large_raw_value_is_caught(tmp_path):
    st = _state()
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression="none", durable=False)
    with sp.open(p) as r:
        info = r.info("big2")
        shard = r._core.shard_files()[info.shard][0]
    # In the third 4 MiB piece, inside a 256 KiB block that is not the first.
    _flip(shard, info.offset + (2 << 20) * 2 + 300_000)
    targets = {k: np.zeros_like(v) for k, v in st.items()}
    with sp.open(p) as r, pytest.raises(ChecksumMismatchError, match="big2"):
        r.load_into(targets)
    with sp.open(p, verify=False) as r:  # opting out reads the damaged bytes as they are
        r.load_into(targets)
    assert not np.array_equal(targets["big2"], st["big2"])


def test_a_shard_truncated_after_open_is_an_error_not_a_crash(tmp_path):
    st = _state()
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression="none", durable=False)
    targets = {k: np.zeros_like(v) for k, v in st.items()}
    with sp.open(p) as r:
        shard = r._core.shard_files()[0][0]
        os.truncate(shard, os.path.getsize(shard) // 2)
        with pytest.raises(CorruptCheckpointError, match="truncated"):
            r.load_into(targets)


# --- Hugging Face directories -----------------------------------------------------------------
def _hf_dir(tmp_path) -> tuple[str, dict[str, np.ndarray]]:
    st = {k: v for k, v in _state().items() if v.dtype != ml_dtypes.bfloat16}
    st["ids"] = np.arange(1000, dtype=np.int64)
    d = tmp_path / "hf"
    d.mkdir()
    st_save(st, str(d / "model.safetensors"))
    return str(d), st


def test_hf_directory_loads_into_existing_arrays(tmp_path):
    d, st = _hf_dir(tmp_path)
    targets = {k: np.full_like(v, 9) for k, v in st.items()}
    ptrs = {k: v.ctypes.data for k, v in targets.items()}
    with sp.open(d) as r:
        r.load_into(targets)
    for k, v in st.items():
        assert targets[k].ctypes.data == ptrs[k]
        np.testing.assert_array_equal(targets[k], v)


def test_hf_load_into_checks_targets_and_a_short_file(tmp_path):
    d, st = _hf_dir(tmp_path)
    with sp.open(d) as r, pytest.raises(InvalidArgumentError, match="big2"):
        r.load_into({"big2": np.zeros((1000, 1200), np.float32)})
    f = os.path.join(d, "model.safetensors")
    with sp.open(d) as r:
        r.info("big2")  # the header is read and checked while the file is whole
        os.truncate(f, os.path.getsize(f) - 100)
        with pytest.raises(CorruptCheckpointError, match="model.safetensors"):
            r.load_into({"big2": np.zeros_like(st["big2"])})


# --- io modes ---------------------------------------------------------------------------------
def test_io_auto_picks_by_file_system(tmp_path):
    kind = fs_type(tmp_path)
    assert kind is not None and kind
    want = "pread" if kind.split(".")[0] in {"nfs", "nfs4", "fuse", "cifs", "9p"} else "mmap"
    assert resolve_io("auto", tmp_path / "ck") == want
    assert resolve_io("pread", tmp_path) == "pread"
    with pytest.raises(InvalidArgumentError, match="io must be one of"):
        resolve_io("direct", tmp_path)


def test_io_auto_remembers_the_choice_per_file_system(tmp_path):
    # mountinfo is parsed once per file system (device), not on every open
    from shardpoint.storage import io_mode

    (tmp_path / "a").mkdir()
    first = resolve_io("auto", tmp_path / "a" / "ck")
    dev = os.stat(tmp_path / "a").st_dev
    assert io_mode._AUTO_BY_DEV[dev] == first
    # another directory of the same file system answers from the cache, the same
    assert resolve_io("auto", tmp_path / "ck") == first
    # a path that does not exist yet still resolves (its open reports the real problem)
    assert resolve_io("auto", tmp_path / "missing" / "ck") in ("mmap", "pread")


@pytest.mark.parametrize("io", ["mmap", "pread", "auto"])
def test_every_io_mode_reads_the_same_values(tmp_path, io):
    st = _state()
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression="none", durable=False)
    got = sp.load_file(p, io=io)
    for k, v in st.items():
        np.testing.assert_array_equal(got[k].view(np.uint8), v.view(np.uint8))
    if io == "pread":  # private memory: it outlives a truncation of the file (a view would fault)
        with sp.open(p) as r:
            shard = r._core.shard_files()[0][0]
        os.truncate(shard, 0)
        np.testing.assert_array_equal(got["big2"], st["big2"])


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_hf_io_modes(tmp_path, io):
    d, st = _hf_dir(tmp_path)
    with sp.open(d, io=io) as r:
        got = r.load()
        one = r["big2"]
    for k, v in st.items():
        np.testing.assert_array_equal(got[k], v)
    np.testing.assert_array_equal(one, st["big2"])
    assert one.flags.writeable


# --- runs of values read with one vectored read (rust/src/runs.rs) ---------------------------
def _many_small() -> dict[str, np.ndarray]:
    """2,000 values of 1-700 bytes lying end to end (runs cut by block, iovec and run limits),
    around two large ones."""
    rng = np.random.default_rng(41)
    out: dict[str, np.ndarray] = {"a_big": rng.standard_normal(300_000).astype(np.float32)}
    for i in range(2000):
        out[f"v{i:04d}"] = rng.integers(0, 255, int(rng.integers(1, 700)), dtype=np.uint8)
    out["z_big"] = rng.standard_normal(200_000).astype(np.float32)
    return out


@pytest.mark.parametrize("fmt", ["none", "hf"])
def test_runs_of_small_values_land_in_their_own_arrays(tmp_path, fmt):
    st = _many_small()
    if fmt == "hf":
        p = str(tmp_path / "hf")
        os.mkdir(p)
        st_save(st, os.path.join(p, "model.safetensors"))
    else:
        p = str(tmp_path / "ck")
        sp.save_file(st, p, compression="none", durable=False)
    targets = {k: np.full_like(v, 7) for k, v in st.items()}
    with sp.open(p) as r:
        r.load_into(targets)
    for k, v in st.items():
        np.testing.assert_array_equal(targets[k], v, err_msg=k)


def test_a_flipped_byte_in_a_run_names_its_own_value(tmp_path):
    st = _many_small()
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression="none", durable=False)
    with sp.open(p) as r:
        info = r.info("v1234")
        shard = r._core.shard_files()[info.shard][0]
    _flip(shard, info.offset + info.stored_bytes - 1)
    targets = {k: np.zeros_like(v) for k, v in st.items()}
    with sp.open(p) as r, pytest.raises(ChecksumMismatchError, match="v1234"):
        r.load_into(targets)


def test_a_shard_cut_inside_a_run_of_small_values_names_the_file(tmp_path):
    st = _many_small()
    p = str(tmp_path / "ck")
    sp.save_file(st, p, compression="none", durable=False)
    targets = {k: np.zeros_like(v) for k, v in st.items() if k.startswith("v")}
    with sp.open(p) as r:
        info = r.info("v1000")
        shard = r._core.shard_files()[info.shard][0]
        os.truncate(shard, info.offset + 3)
        with pytest.raises(CorruptCheckpointError, match="truncated") as e:
            r.load_into(targets)
    assert os.path.basename(shard) in str(e.value)
