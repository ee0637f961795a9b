"""Golden delta checkpoints (tests/golden/delta_v1, made once by tests/golden/gen_golden_delta.py)
read back through ``sp.load_file``/``sp.open`` and through the independent reference reader
(tests/reference_reader_delta.py) to the values recorded in tests/golden/expected_delta_v1.json;
a plain reader finds no value under delta-coded keys; a moved base or a damaged link is refused
by both readers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
import reference_reader as rr  # noqa: E402
import reference_reader_delta as rd  # noqa: E402

HERE = os.path.join(TESTS, "golden")
DIR = os.path.join(HERE, "delta_v1")
with open(os.path.join(HERE, "expected_delta_v1.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)
NAMES = sorted(EXPECTED["checkpoints"])


def _bytes_of(v: object) -> bytes:
    if isinstance(v, np.ndarray):
        return np.ascontiguousarray(v).tobytes()
    assert isinstance(v, str)
    return v.encode("utf-8")


def test_golden_delta_files_present_and_small() -> None:
    want = sorted(f for n in NAMES for f in EXPECTED["checkpoints"][n]["files"])
    assert sorted(os.listdir(DIR)) == want
    assert sum(os.path.getsize(os.path.join(DIR, f)) for f in want) < 120_000
    modes = {e["mode"] for c in EXPECTED["checkpoints"].values() for e in c["entries"].values()}
    assert modes == {"same", "xor", "full"}
    assert max(c["depth"] for c in EXPECTED["checkpoints"].values()) == 2


@pytest.mark.parametrize("name", NAMES)
def test_load_file_and_modes(name: str) -> None:
    exp = EXPECTED["checkpoints"][name]
    prefix = os.path.join(DIR, name)
    got = sp.load_file(prefix)
    assert sorted(got) == sorted(exp["entries"])
    for key, rec in exp["entries"].items():
        assert hashlib.sha256(_bytes_of(got[key])).hexdigest() == rec["sha256"], key
    info = spd.describe(prefix)
    assert info.get("depth", 0) == exp["depth"]
    for key, t in info.get("tensors", {}).items():
        assert t["mode"] == exp["entries"][key]["mode"], key
    with sp.open(prefix) as r:
        r.verify()


@pytest.mark.parametrize("name", NAMES)
def test_reference_reader_resolves_the_chain(name: str) -> None:
    exp = EXPECTED["checkpoints"][name]
    got = rd.read_resolved(os.path.join(DIR, name))
    assert sorted(got) == sorted(exp["entries"])
    for key, rec in exp["entries"].items():
        dtype, dims, raw = got[key]
        assert hashlib.sha256(raw).hexdigest() == rec["sha256"], key
        assert [dtype, list(dims)] == [rec["dtype"], rec["dims"]], key


def test_plain_reference_reader_finds_no_value_under_delta_keys() -> None:
    exp = EXPECTED["checkpoints"]["step2"]["entries"]
    ck = rr.read_checkpoint(os.path.join(DIR, "step2"))
    for key, rec in exp.items():
        assert (key in ck.entries) == (rec["mode"] == "full"), key
        if rec["mode"] != "full":
            assert rd.PAYLOAD_PREFIX + key in ck.entries


def test_changed_or_damaged_link_is_refused_by_both_readers(tmp_path: os.PathLike[str]) -> None:
    d = os.path.join(tmp_path, "chain")
    shutil.copytree(DIR, d)
    index = os.path.join(d, "step1.index")  # the middle link: step2 pins its index
    data = bytearray(open(index, "rb").read())
    data[-20] ^= 0x01
    with open(index, "wb") as f:
        f.write(data)
    with pytest.raises(rr.FormatError, match="index digest"):
        rd.read_resolved(os.path.join(d, "step2"))
    with pytest.raises(sp.BaseMismatchError):  # the pin is checked before the bytes
        sp.load_file(os.path.join(d, "step2"))
    shutil.rmtree(d)
    shutil.copytree(DIR, d)
    for f in os.listdir(d):
        if f.startswith("base."):
            os.remove(os.path.join(d, f))
    with pytest.raises(FileNotFoundError):
        rd.read_resolved(os.path.join(d, "step2"))
    with pytest.raises(sp.NotFoundError):
        sp.load_file(os.path.join(d, "step2"))
