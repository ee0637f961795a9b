"""Damaged Hugging Face checkpoints: a clear ``CorruptCheckpointError`` naming file and key.

Every damaged single file is also offered to ``safetensors.safe_open``: the library must refuse
it too, so our checks are as strict as the library's (not stricter on valid files, see the
round-trip tests; not looser here).
"""

from __future__ import annotations

import json
import os
import re
import struct

import numpy as np
import pytest
from safetensors import safe_open

import shardpoint as sp


def st_bytes(header: dict, data: bytes, *, pad: bool = True) -> bytes:
    blob = json.dumps(header).encode()
    if pad:
        blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data


GOOD_HEADER = {
    "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
}
GOOD_DATA = np.arange(6, dtype=np.float32).tobytes() + np.arange(2, dtype=np.int64).tobytes()


def _with(**changes: object) -> dict:
    h = json.loads(json.dumps(GOOD_HEADER))
    for k, v in changes.items():
        key, field = k.split("__")
        h[key][field] = v
    return h


CASES = {
    "header_length_past_eof": struct.pack("<Q", 10_000) + b"{}",
    "header_too_large": struct.pack("<Q", 200_000_000) + b"{" + b" " * 100,
    "short_file": b"\x01\x02",
    "not_json": struct.pack("<Q", 8) + b"{nope!!}",
    "not_an_object_start": struct.pack("<Q", 8) + b"[1,2,3] ",
    "overlap": st_bytes(_with(b__data_offsets=[16, 32]), GOOD_DATA[:32]),
    "hole": st_bytes(_with(b__data_offsets=[28, 44]), GOOD_DATA + b"\0" * 4),
    "trailing_bytes": st_bytes(GOOD_HEADER, GOOD_DATA + b"\0" * 8),
    "out_of_file": st_bytes(_with(b__data_offsets=[24, 4000]), GOOD_DATA),
    "shape_vs_bytes": st_bytes(_with(a__shape=[2, 4]), GOOD_DATA),
    "unknown_dtype": st_bytes(_with(a__dtype="F99"), GOOD_DATA),
    "negative_dim": st_bytes(_with(a__shape=[-2, -3]), GOOD_DATA),
    "begin_after_end": st_bytes(_with(a__data_offsets=[24, 0]), GOOD_DATA),
    "huge_shape": st_bytes(_with(a__shape=[2**62, 2**62, 2**62]), GOOD_DATA),
    "bad_metadata": st_bytes({"__metadata__": {"x": 1}, **GOOD_HEADER}, GOOD_DATA),
}


def test_good_file_reads(tmp_path) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(st_bytes(GOOD_HEADER, GOOD_DATA))
    with sp.open(p) as r:
        assert np.array_equal(r["a"], np.arange(6, dtype=np.float32).reshape(2, 3))
    with safe_open(p, framework="np") as f:
        assert np.array_equal(f.get_tensor("b"), np.arange(2))


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_single_file(tmp_path, case: str) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(CASES[case])
    with pytest.raises(Exception):  # noqa: B017 - the library's error class is not public
        with safe_open(p, framework="np") as f:
            [f.get_tensor(k) for k in f.keys()]
    with pytest.raises(sp.CorruptCheckpointError) as e:
        with sp.open(str(p)) as r:
            r.load()
    assert "model.safetensors" in str(e.value)


def test_error_names_the_key(tmp_path) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(CASES["shape_vs_bytes"])
    with pytest.raises(sp.CorruptCheckpointError, match=r"key 'a'.*F32\[2, 4\] needs 32 bytes"):
        sp.open(str(p))


def _sharded(tmp_path) -> str:
    d = tmp_path / "m"
    d.mkdir()
    (d / "model-00001-of-00002.safetensors").write_bytes(st_bytes(GOOD_HEADER, GOOD_DATA))
    h2 = {"c": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}
    (d / "model-00002-of-00002.safetensors").write_bytes(st_bytes(h2, b"\1\2\3\4"))
    wm = {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
    }
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 44}, "weight_map": wm})
    )
    return str(d)


def _set_index(d: str, doc: object) -> None:
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))


def test_index_names_a_missing_file(tmp_path) -> None:
    d = _sharded(tmp_path)
    os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
    with sp.open(d) as r:
        assert list(r["a"].shape) == [2, 3]  # the other shard is fine
        with pytest.raises(sp.CorruptCheckpointError, match=r"model-00002-of-00002.*missing.*'c'"):
            r["c"]
        with pytest.raises(sp.CorruptCheckpointError):
            r.verify()


def test_index_key_absent_from_its_shard(tmp_path) -> None:
    d = _sharded(tmp_path)
    wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
    wm["ghost"] = "model-00002-of-00002.safetensors"
    _set_index(d, {"weight_map": wm})
    with sp.open(d) as r:
        assert r["c"].tolist() == [1, 2, 3, 4]
        with pytest.raises(sp.CorruptCheckpointError, match=r"00002.*'ghost'.*absent"):
            r["ghost"]
        with pytest.raises(sp.CorruptCheckpointError, match="ghost"):
            r.info("ghost")


@pytest.mark.parametrize(
    "doc, needle",
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "weight_map"),
        ({"weight_map": []}, "weight_map"),
        ({"weight_map": {"a": 3}}, "not a file name"),
        ({"weight_map": {"a": "../evil.safetensors"}}, "relative"),
        ({"weight_map": {"a": "/etc/x.safetensors"}}, "relative"),
        ({"weight_map": {"a": "model.bin"}}, ".safetensors"),
        ('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}', "duplicate"),
        ({"weight_map": {}, "metadata": [1]}, "metadata"),
    ],
)
def test_bad_index(tmp_path, doc: object, needle: str) -> None:
    d = _sharded(tmp_path)
    _set_index(d, doc)
    with pytest.raises(sp.CorruptCheckpointError, match=needle) as e:
        sp.open(d)
    assert "model.safetensors.index.json" in str(e.value)


def test_damaged_shard_found_on_first_use_not_at_open(tmp_path) -> None:
    d = _sharded(tmp_path)
    with open(os.path.join(d, "model-00002-of-00002.safetensors"), "r+b") as f:
        f.truncate(20)
    r = sp.open(d)  # opening reads the index only
    assert r["b"].tolist() == [0, 1]
    with pytest.raises(sp.CorruptCheckpointError, match="model-00002-of-00002.safetensors"):
        r["c"]


def test_unsupported_but_valid_dtype(tmp_path) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(
        st_bytes({"e": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, b"\1" * 3)
    )
    with sp.open(str(p)) as r:
        assert "e" in r
        with pytest.raises(sp.UnsupportedDTypeError, match="F6_E2M3"):
            r["e"]
    # F8_E8M0 (was unsupported) reads as ml_dtypes' float8_e8m0fnu since issue 14
    q = tmp_path / "e8m0.safetensors"
    q.write_bytes(
        st_bytes({"e": {"dtype": "F8_E8M0", "shape": [4], "data_offsets": [0, 4]}}, b"\1" * 4)
    )
    with sp.open(str(q)) as r:
        assert r["e"].dtype.name == "float8_e8m0fnu" and r["e"].view("u1").tolist() == [1] * 4


@pytest.mark.parametrize("n", [2**63, 2**64 - 1])
def test_header_length_near_the_u64_limit(tmp_path, n: int) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", n) + b"{}" + b" " * 6)
    with pytest.raises(sp.CorruptCheckpointError, match=rf"header length {n} exceeds") as e:
        sp.open(str(p))
    assert str(p) in str(e.value)


_SHRINK = r"""
import os, sys, numpy as np, shardpoint as sp
path, how = sys.argv[1], sys.argv[2]
if how == "open":
    r = sp.open(path, io="mmap")
    first = r["a"].copy()
    os.truncate(path, os.path.getsize(path) - 8)  # the tail of "b"
    try:
        r["b"].copy()  # touching a view past the new end of file: SIGBUS before
    except sp.CorruptCheckpointError as e:
        print("refused:", e)
else:
    import torch, shardpoint.torch as spt
    it = iter(spt.weights_iterator(path, io="mmap", window=1 << 20))
    next(it)  # the iterator reads a window (1 MiB) at a time: the later tensors are not read
    os.truncate(path, os.path.getsize(path) // 2)
    try:
        for _, t in it:
            t.sum()
    except sp.CorruptCheckpointError as e:
        print("refused:", e)
"""


@pytest.mark.parametrize("how", ["open", "weights_iterator"])
def test_a_file_that_shrinks_while_mapped(tmp_path, how: str) -> None:
    """A safetensors file truncated after open (a foreign tool, a partial copy): the mapped
    reader handed out a view of pages past the new end of file, and the process died of SIGBUS
    when it was read. Each view now checks the file's current size first; the weights
    iterator reads with ``pread``, never out of the mapping (its read-ahead thread copied while
    the file shrank: a SIGBUS on CI, tests/serving/test_weights_shrinking.py). In a fresh
    process, so that a SIGBUS fails the test instead of killing pytest."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    p = tmp_path / "model.safetensors"
    if how == "open":
        p.write_bytes(st_bytes(GOOD_HEADER, GOOD_DATA))
        key = "'b'"
    else:  # four 1.2 MB tensors: more than one window of the iterator
        n = 300_000 * 4
        header = {
            f"t{i}": {"dtype": "F32", "shape": [300_000], "data_offsets": [i * n, (i + 1) * n]}
            for i in range(4)
        }
        p.write_bytes(st_bytes(header, np.arange(4 * 300_000, dtype=np.float32).tobytes()))
        key = "'t[123]'"  # the first not yet read when the file shrank (t0 was handed out)
    got = subprocess.run(
        [sys.executable, "-c", _SHRINK, str(p), how], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    refused = rf"refused: {re.escape(str(p))}: key {key}: file is now {p.stat().st_size} bytes"
    assert re.search(refused, got.stdout), got
    assert "truncated or rewritten in place after open" in got.stdout
