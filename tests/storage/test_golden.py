"""Golden checkpoints of format v1 (tests/golden/v1, made once by tests/golden/gen_golden.py) must
keep reading, with ``sp.load_file``, lazily with ``sp.open``, and with the reference reader, to the
values recorded in tests/golden/expected_v1.json. The Rust side is tests/golden_v1.rs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil

import numpy as np
import pytest

import reference_reader as rr
import shardpoint as sp

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden")
with open(os.path.join(HERE, "expected_v1.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)
NAMES = sorted(EXPECTED["checkpoints"])


def expected_value(rec: dict) -> object:
    kind = rec["kind"]
    if kind == "bytes":
        return bytes.fromhex(rec["hex"])
    if kind == "int":
        return int(rec["decimal"])
    if kind == "float":
        return float(rec["repr"])
    return rec["value"]


def check_value(key: str, rec: dict, got: object) -> None:
    if rec["kind"] == "tensor":
        assert isinstance(got, np.ndarray), key
        assert got.dtype.name == rec["dtype"], (key, got.dtype)
        assert list(got.shape) == rec["shape"], (key, got.shape)
        assert hashlib.sha256(got.tobytes()).hexdigest() == rec["sha256"], key
        return
    want = expected_value(rec)
    if isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), key
        return
    assert got == want and type(got) is type(want), (key, got, want)


def test_golden_files_present_and_small() -> None:
    files = sorted(os.listdir(os.path.join(HERE, "v1")))
    want = sorted(f for n in NAMES for f in EXPECTED["checkpoints"][n]["files"])
    assert files == want
    assert sum(os.path.getsize(os.path.join(HERE, "v1", f)) for f in files) < 200_000


@pytest.mark.parametrize("name", NAMES)
def test_load_file(name: str) -> None:
    exp = EXPECTED["checkpoints"][name]
    got = sp.load_file(os.path.join(HERE, "v1", name))
    assert sorted(got) == sorted(exp["entries"])
    for key, rec in exp["entries"].items():
        check_value(key, rec, got[key])


@pytest.mark.parametrize("name", NAMES)
def test_open_lazily(name: str) -> None:
    exp = EXPECTED["checkpoints"][name]
    with sp.open(os.path.join(HERE, "v1", name)) as r:
        r.verify()
        assert r.metadata == exp["metadata"]
        assert r.format_info["format"] == 1
        assert r.keys() == sorted(exp["entries"], key=lambda k: k.encode())
        for key, rec in exp["entries"].items():
            check_value(key, rec, r[key])
            info = r.info(key)
            assert (info.codec, info.crc32c, info.raw_bytes, info.shard) == (
                rec["codec"],
                rec["crc32c"],
                rec["raw_len"],
                rec["shard"],
            )
        assert r.prefix("ints/") == sorted(k for k in exp["entries"] if k.startswith("ints/"))
        kernel = r["net/dense/kernel"]
        np.testing.assert_array_equal(r.slice("net/dense/kernel", 13, 57), kernel[13:57])


@pytest.mark.parametrize("name", NAMES)
def test_reference_reader(name: str) -> None:
    exp = EXPECTED["checkpoints"][name]
    ck = rr.read_checkpoint(os.path.join(HERE, "v1", name))
    assert ck.user_metadata == exp["metadata"]
    assert ck.metadata["format"] == 1
    assert sorted(ck.values) == sorted(exp["entries"])
    for key, rec in exp["entries"].items():
        e = ck.entries[key]
        assert (e.codec, e.crc, e.raw_len, e.shard) == (
            rec["codec"],
            rec["crc32c"],
            rec["raw_len"],
            rec["shard"],
        )
        assert hashlib.sha256(ck.raw[key]).hexdigest() == rec["raw_sha256"], key
        check_value(key, rec, ck.values[key])


def test_golden_covers_the_format() -> None:
    """The golden set exercises every codec, ndim 0, empties, both shards and every kind."""
    mixed = EXPECTED["checkpoints"]["mixed"]["entries"].values()
    assert {r["codec"] for r in mixed} == {"none", "zstd", "zstd-bytegroup"}
    assert {r["shard"] for r in mixed} == {0, 1}
    assert {r["kind"] for r in mixed} == {"tensor", "bytes", "str", "int", "float", "json"}
    shapes = [r["shape"] for r in mixed if r["kind"] == "tensor"]
    assert [] in shapes and any(0 in s for s in shapes) and any(len(s) == 3 for s in shapes)
    dtypes = {r["dtype"] for r in mixed if r["kind"] == "tensor"}
    assert {"bfloat16", "float8_e4m3fn", "float8_e5m2", "complex128", "bool"} <= dtypes


def test_golden_chunk_and_plane_coverage() -> None:
    """The mixed checkpoint holds raw and compressed chunks in one entry, and byte-grouped
    chunks with both raw and zstd plane segments (FORMAT.md §5)."""
    ck = rr.read_checkpoint(os.path.join(HERE, "v1", "mixed"))
    e = ck.entries["net/partly_noise"]
    assert e.codec == "zstd-bytegroup" and len(e.chunks) == 3 and e.chunks_stored_raw == 1
    assert ck.entries["net/dense/kernel"].planes_raw > 0
    assert ck.entries["net/dense/kernel"].planes_compressed > 0
    assert ck.entries["quant/e4m3"].codec == "zstd"


def test_renamed_checkpoint_still_reads(tmp_path) -> None:
    """Shard names are stored as suffixes: `mv P.* Q.*` keeps a checkpoint valid (FORMAT.md §1)."""
    for f in EXPECTED["checkpoints"]["mixed"]["files"]:
        shutil.copy(os.path.join(HERE, "v1", f), tmp_path / f.replace("mixed", "moved", 1))
    got = sp.load_file(tmp_path / "moved")
    for key, rec in EXPECTED["checkpoints"]["mixed"]["entries"].items():
        check_value(key, rec, got[key])


def test_golden_v2_hashed_holds_v1_mixed() -> None:
    """tests/golden/v2 (gen_golden_v2.py): v1's ``mixed`` with hashed shard names (FORMAT.md
    §3.1.1), index format version 2; read by the library and by the reference reader."""
    v2 = os.path.join(HERE, "v2")
    files = sorted(
        os.path.relpath(os.path.join(root, f), v2) for root, _, fs in os.walk(v2) for f in fs
    )
    assert files == ["mixed.index", "mixed/6a/data-00001-of-00002", "mixed/cf/data-00000-of-00002"]
    prefix = os.path.join(v2, "mixed")
    with open(prefix + ".index", "rb") as f:
        assert f.read(12)[8:] == (2).to_bytes(4, "little")
    exp = EXPECTED["checkpoints"]["mixed"]
    got = sp.load_file(prefix)
    ref, _ = rr.load(prefix)
    assert sorted(got) == sorted(ref) == sorted(exp["entries"])
    for key, rec in exp["entries"].items():
        check_value(key, rec, got[key])
        check_value(key, rec, ref[key])
    with sp.open(prefix) as r:
        r.verify()
        assert r.metadata == exp["metadata"]
        for key, rec in exp["entries"].items():
            # shard and crc as v1's; codecs may differ (the default choice changed since v1)
            assert (r.info(key).shard, r.info(key).crc32c) == (rec["shard"], rec["crc32c"]), key
