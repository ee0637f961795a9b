"""Issue 12 item 5 (storage face): every path that returns values checks their crc32c.

Values under 4 KiB (biases, norms, counters) are stored uncompressed; one flipped bit in such a
payload must raise ``ChecksumMismatchError`` on every read path unless the caller opted out with
``verify=False``.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp

#: name -> read through that path (reader opened with the default settings)
READ_PATHS = {
    "getitem": lambda p: sp.open(p)["bias"],
    "get": lambda p: sp.open(p).get("bias"),
    "load": lambda p: sp.open(p).load(),
    "load-keys": lambda p: sp.open(p).load(["bias"]),
    "load_file": lambda p: sp.load_file(p),
    "load_file-copy": lambda p: sp.load_file(p, copy=True),
    "slice": lambda p: sp.open(p).slice("bias", 0, 2),
    "get_slice": lambda p: sp.open(p).get_slice("bias")[0:2],
    "copy-getitem": lambda p: sp.open(p, copy=True)["bias"],
    "verify": lambda p: sp.open(p).verify(),
}


def _flipped(tmp_path) -> str:
    p = str(tmp_path / "ck")
    sp.save_file({"bias": np.full(4, 42.0, np.float32), "step": 7}, p)
    with sp.open(p) as r:
        info = r.info("bias")
        [(shard, _)] = r.format_info["shards"]
    assert info.codec == "none"
    with open(shard, "r+b") as f:  # one bit of the first float's exponent
        f.seek(info.offset + 3)
        b = f.read(1)[0]
        f.seek(info.offset + 3)
        f.write(bytes([b ^ 0x01]))
    return p


@pytest.mark.parametrize("path", sorted(READ_PATHS))
def test_flipped_bit_in_small_raw_value_raises(tmp_path, path):
    p = _flipped(tmp_path)
    with pytest.raises(sp.ChecksumMismatchError, match="bias"):
        READ_PATHS[path](p)


def test_verify_false_is_an_explicit_opt_out(tmp_path):
    p = _flipped(tmp_path)
    assert sp.open(p, verify=False)["bias"][0] != 42.0
    assert sp.open(p).get("bias", verify=False)[0] != 42.0
    assert sp.load_file(p, verify=False)["bias"][0] != 42.0
    assert sp.open(p)["step"] == 7  # the undamaged value still reads


def test_intact_values_read_with_checks_on(tmp_path):
    p = str(tmp_path / "ck")
    vals = {"bias": np.full(4, 42.0, np.float32), "w": np.arange(10_000, dtype=np.float32)}
    sp.save_file(vals, p, compression="none")
    with sp.open(p) as r:
        np.testing.assert_array_equal(r["bias"], vals["bias"])
        np.testing.assert_array_equal(r.slice("w", 5, 9), vals["w"][5:9])
        np.testing.assert_array_equal(r.slice("w", 9000, 9002), vals["w"][9000:9002])
    out = sp.load_file(p, copy=True)
    np.testing.assert_array_equal(out["w"], vals["w"])
    out["w"][0] = 5.0  # private memory, writable
