"""Conversions between shardpoint, safetensors and PyTorch files, and the diff engine.

Round trips are checked bitwise (bytes, dtype and shape of every tensor), bfloat16 included.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file as st_save

import shardpoint as sp
from shardpoint.convert import convert, detect_format, open_source
from shardpoint.convert.compare import diff_sources, max_abs_diff


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "embed.weight": rng.standard_normal((64, 48)).astype(ml_dtypes.bfloat16),
        "layer.0.w": rng.standard_normal((48, 48)).astype(np.float32),
        "layer.0.b": rng.standard_normal(48).astype(np.float16),
        "big": rng.standard_normal(600_000).astype(np.float32),  # > one 1 MiB chunk
        "f64": np.array([np.nan, -0.0, np.inf, 1e300]),
        "ids": np.arange(-5, 5, dtype=np.int64).reshape(2, 5),
        "i32": np.array([2**31 - 1, -(2**31)], dtype=np.int32),
        "u8": np.arange(7, dtype=np.uint8),
        "mask": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "f8": np.array([0.5, -2.0, 448.0], dtype=ml_dtypes.float8_e4m3fn),
    }


def assert_bitwise(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, a in want.items():
        b = got[k]
        assert (b.dtype, b.shape) == (a.dtype, a.shape), k
        assert b.tobytes() == a.tobytes(), k


def read_st(path: str) -> dict[str, np.ndarray]:
    """Read with the safetensors package (float8 through the header, as numpy cannot)."""
    out = {}
    with safe_open(path, framework="numpy") as f:
        for k in f.keys():
            if f.get_slice(k).get_dtype() != "F8_E4M3":
                out[k] = f.get_tensor(k)
    return out


def write_st_with_f8(path: str, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Write ``values`` with the safetensors package; returns what was written. float8 needs
    the torch API of safetensors (its numpy API cannot write it), so without torch it is left out."""
    meta = {"format": "pt", "note": "hello"}
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError:
        values = {k: v for k, v in values.items() if v.dtype != ml_dtypes.float8_e4m3fn}
        st_save(values, path, metadata=meta)
        return values

    tt = {}
    for k, v in values.items():
        if v.dtype == ml_dtypes.float8_e4m3fn:
            tt[k] = torch.from_numpy(v.view(np.uint8).copy()).view(torch.float8_e4m3fn)
        elif v.dtype == ml_dtypes.bfloat16:
            tt[k] = torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
        else:
            tt[k] = torch.from_numpy(v.copy())
    save_file(tt, path, metadata=meta)
    return values


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_safetensors_roundtrip_is_bitwise(tmp_path, compression):
    src, mid, back = (str(tmp_path / n) for n in ("a.safetensors", "ck", "b.safetensors"))
    want = write_st_with_f8(src, tensors())
    res = convert(src, mid, compression=compression)
    assert (res.src_format, res.dst_format, res.entries) == ("safetensors", "shardpoint", len(want))
    assert_bitwise(sp.load_file(mid), want)
    assert sp.open(mid).metadata == {"format": "pt", "note": "hello"}
    convert(mid, back)
    with safe_open(back, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "note": "hello"}
    no_f8 = {k: v for k, v in want.items() if k != "f8"}
    assert_bitwise(read_st(back), no_f8)
    if "f8" in want:  # our reader of the written file agrees on the float8 tensor too
        with open_source(back) as s:
            assert s.read("f8").tobytes() == want["f8"].tobytes()


def test_safetensors_numpy_api_file_converts(tmp_path):
    src = str(tmp_path / "np.safetensors")
    want = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, ml_dtypes.bfloat16)}
    st_save(want, src)
    convert(src, str(tmp_path / "ck"))
    assert_bitwise(sp.load_file(str(tmp_path / "ck")), want)


def test_shardpoint_values_and_metadata_to_safetensors(tmp_path):
    ck = str(tmp_path / "ck")
    sp.save_file(
        {
            "w": np.ones((2, 2), np.float32),
            "step": 7,
            "name": "run",
            "c": np.ones(2, np.complex128),
        },
        ck,
        metadata={"epoch": 3, "tag": "x"},
    )
    res = convert(ck, str(tmp_path / "o.safetensors"))
    assert res.entries == 1
    assert sorted(n.split("'")[1] for n in res.notes) == ["c", "name", "step"]
    with safe_open(str(tmp_path / "o.safetensors"), framework="numpy") as f:
        assert f.keys() == ["w"] and f.metadata() == {"epoch": "3", "tag": "x"}


def test_torch_state_dict_converts(tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    sd = net.state_dict()
    sd["extra.bf16"] = torch.randn(5).to(torch.bfloat16)
    path = str(tmp_path / "model.pt")
    torch.save({"model": sd, "epoch": 4, "lr": 0.5, "tag": "best", "hist": [1, 2]}, path)
    assert detect_format(path)[0] == "torch"
    res = convert(path, str(tmp_path / "ck"))
    got = sp.load_file(str(tmp_path / "ck"))
    for k, t in sd.items():
        want = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        g = got[f"model/{k}"]
        assert g.view(want.dtype).tobytes() == want.tobytes() and g.shape == tuple(t.shape), k
    assert got["model/extra.bf16"].dtype == ml_dtypes.bfloat16
    assert (got["epoch"], got["lr"], got["tag"], got["hist/0"], got["hist/1"]) == (
        4,
        0.5,
        "best",
        1,
        2,
    )
    assert res.src_format == "torch"


def test_legacy_torch_file_and_bin_suffix(tmp_path):
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "pytorch_model.bin")
    torch.save({"w": torch.arange(4.0)}, path, _use_new_zipfile_serialization=False)
    convert(path, str(tmp_path / "ck"))
    assert sp.load_file(str(tmp_path / "ck"))["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_torch_file_with_code_is_refused(tmp_path):
    pytest.importorskip("torch")
    import pickle

    path = str(tmp_path / "evil.pt")
    with open(path, "wb") as f:
        pickle.dump({"w": os.getcwd}, f, protocol=2)  # a callable: weights_only must refuse it
    with pytest.raises(sp.CorruptCheckpointError, match="cannot load as a PyTorch file"):
        convert(path, str(tmp_path / "ck"))


def test_shardpoint_recompress_and_large_streaming(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    want = {f"t{i}": np.full((256, 1024), i, dtype=np.float32) for i in range(12)}  # 12 MiB
    sp.save_file(want, a, compression="none")
    convert(a, b, compression="zstd", shards=3)
    info = sp.open(b).format_info
    assert len(info["shards"]) == 3
    assert sum(n for _, n in info["shards"]) < 2 << 20  # constant tensors compress
    assert_bitwise(sp.load_file(b), want)


def test_destination_rules(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sp.save_file({"x": np.ones(3)}, a)
    with pytest.raises(sp.InvalidArgumentError, match="same"):
        convert(a, a, overwrite=True)
    convert(a, b)
    with pytest.raises(sp.InvalidArgumentError, match="exists"):
        convert(a, b)
    sp.save_file({"x": np.zeros(3)}, a)
    convert(a, b, overwrite=True)
    assert sp.load_file(b)["x"].tolist() == [0, 0, 0]
    convert(a, str(tmp_path / "no" / "dir" / "c"))  # missing parents are created
    assert sp.exists(str(tmp_path / "no" / "dir" / "c"))
    with pytest.raises(sp.InvalidArgumentError, match="cannot write"):
        convert(a, str(tmp_path / "c"), to="tensorflow")
    with pytest.raises(sp.NotFoundError):
        convert(str(tmp_path / "missing"), str(tmp_path / "c"))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01garbage")
    with pytest.raises(sp.InvalidArgumentError, match="unknown file format"):
        convert(str(junk), str(tmp_path / "c"))


def test_failed_conversion_leaves_no_checkpoint(tmp_path):
    src = str(tmp_path / "a.safetensors")
    st_save({"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}, src)
    data = bytearray(open(src, "rb").read())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["b"]["data_offsets"] = [0, 12]  # overlaps "a": safetensors refuses the file
    blob = json.dumps(header).encode()
    open(src, "wb").write(len(blob).to_bytes(8, "little") + blob + data[8 + n :])
    with pytest.raises(sp.CorruptCheckpointError, match="not a valid safetensors file"):
        convert(src, str(tmp_path / "ck"))
    assert not sp.exists(str(tmp_path / "ck"))


def test_max_abs_diff_semantics():
    a = np.array([1.0, np.nan, 3.0], np.float32)
    assert max_abs_diff(a, a.copy()) == (True, 0.0)  # NaN equals NaN at the same place
    assert max_abs_diff(a, np.array([1.0, np.nan, 3.5], np.float32)) == (False, 0.5)
    assert max_abs_diff(a, np.array([1.0, 2.0, 3.0], np.float32))[1] == float("inf")
    bf = np.array([1, 2], ml_dtypes.bfloat16)
    assert max_abs_diff(bf, np.array([1, 2.5], ml_dtypes.bfloat16)) == (False, 0.5)
    assert max_abs_diff(np.array([True]), np.array([False])) == (False, 1.0)
    assert max_abs_diff(np.array([-0.0]), np.array([0.0])) == (True, 0.0)
    assert (
        max_abs_diff(np.array([1 + 1j], np.complex64), np.array([1 - 2j], np.complex64))[1] == 3.0
    )


def test_diff_across_formats(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b.safetensors")
    sp.save_file({"same": np.ones(3), "close": np.zeros(2), "dt": np.ones(2), "onlya": 1}, a)
    st_save(
        {
            "same": np.ones(3),
            "close": np.array([0, 1e-4]),
            "dt": np.ones(2, np.float32),
            "onlyb": np.ones(1),
        },
        b,
    )
    with open_source(a) as x, open_source(b) as y:
        res = diff_sources(x, y)
        assert res.only_a == ["onlya"] and res.only_b == ["onlyb"]
        assert {(d.key, d.what) for d in res.differences} == {("close", "value"), ("dt", "dtype")}
        res = diff_sources(x, y, atol=1e-3)
        assert {d.key for d in res.differences} == {"dt"} and res.equal["close"] == pytest.approx(
            1e-4
        )
