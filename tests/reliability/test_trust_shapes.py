"""Issue 23 item 3: shapes no array can hold (``[0, 2^64 - 1]``: zero bytes, yet numpy raises
``ValueError`` building it) are refused as ``CorruptCheckpointError`` naming file and key, and
the CLI exits 1 (damaged), never 70 (internal error): native checkpoints, ``.safetensors``
files and Hugging Face directories. numpy's own limits are the reference: a dimension above
``2^63 - 1``, or non-zero dimensions holding more than ``2^63 - 1`` bytes, even beside a 0.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers import craft
from shardpoint.cli import main
from shardpoint.storage.dtypes import shape_problem

# (shape, dtype) pairs numpy refuses although they hold no bytes
UNREPRESENTABLE = [
    ([0, 2**64 - 1], "uint8"),
    ([0, 2**63], "uint8"),
    ([2**61, 0, 2], "float32"),  # non-zero dims: 2^62 elements of 4 bytes
]


@pytest.mark.parametrize(("shape", "dtype"), UNREPRESENTABLE + [([0, 2**63 - 1], "uint8")])
def test_shape_rule_is_numpys(shape, dtype):
    """``shape_problem`` says no exactly where numpy raises (both directions)."""
    bits = 8 * np.dtype(dtype).itemsize
    try:
        np.empty(shape, dtype=dtype)
        numpy_ok = True
    except ValueError:
        numpy_ok = False
    assert (shape_problem(shape, bits) is None) == numpy_ok


def _native(d: str, shape: list[int], dtype: str) -> str:
    p = os.path.join(d, "ck")
    es = [
        craft.CEntry(b"bad/shape", dtype, "none", "tensor", shape, b"", inline_dims=False),
        craft.raw_entry(b"good", "float32", [4], np.arange(4, dtype=np.float32).tobytes()),
    ]
    craft.write_checkpoint(p, es)
    return p


def _safetensors(path: str, shape: list[int], tag: str) -> None:
    header = {
        "bad/shape": {"dtype": tag, "shape": shape, "data_offsets": [0, 0]},
        "good": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
    }
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + np.arange(4, dtype=np.float32).tobytes())


def _check_cli(args: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 1
    err = capsys.readouterr().err
    assert names in err and "bad/shape" in err, err
    assert "internal error" not in err.lower(), err


@pytest.mark.parametrize(("shape", "dtype"), UNREPRESENTABLE)
def test_native_checkpoint(tmp_path, capsys, shape, dtype):
    p = _native(str(tmp_path), shape, dtype)
    with sp.open(p) as r:
        with pytest.raises(sp.CorruptCheckpointError, match=r"ck\.index.*bad/shape"):
            r["bad/shape"]
        with pytest.raises(sp.CorruptCheckpointError, match="bad/shape"):
            r.verify()
    with pytest.raises(sp.CorruptCheckpointError, match="bad/shape"):
        sp.load_file(p)
    _check_cli(["convert", p, str(tmp_path / "out.safetensors")], "ck.index", capsys)
    _check_cli(["verify", p], "ck.index", capsys)


@pytest.mark.parametrize(("shape", "dtype"), UNREPRESENTABLE)
def test_safetensors_file_and_hf_directory(tmp_path, capsys, shape, dtype):
    tag = {"uint8": "U8", "float32": "F32"}[dtype]
    f = str(tmp_path / "m.safetensors")
    _safetensors(f, shape, tag)
    _check_cli(["convert", f, str(tmp_path / "out")], "m.safetensors", capsys)
    _check_cli(["ls", f], "m.safetensors", capsys)
    hf = tmp_path / "hf"
    hf.mkdir()
    _safetensors(str(hf / "model.safetensors"), shape, tag)
    (hf / "config.json").write_text('{"model_type": "bert"}')
    _check_cli(["convert", str(hf), str(tmp_path / "out2")], "model.safetensors", capsys)
    with pytest.raises(sp.CorruptCheckpointError, match="model.safetensors.*bad/shape"):
        with sp.open(str(hf)) as r:
            r["bad/shape"]
