"""Reader.stats / `shardpoint stats`: equal to numpy's float64 reference for every dtype."""

from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np
import pytest

import shardpoint as sp
from shardpoint import _core
from shardpoint.cli import main
from shardpoint.storage.dtypes import numpy_dtype

N = 50_000  # with 64 KiB chunks: several chunks for every dtype wider than one byte


def _random(name: str, rng: np.random.Generator) -> np.ndarray:
    dt = numpy_dtype(name)
    if dt == np.bool_:
        return rng.random(N) < 0.3
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(int(info.min), -(2**40)), min(int(info.max), 2**40)
        return rng.integers(lo, hi, N, endpoint=True).astype(dt)
    scale = 3.0 if name.startswith("float8") else 100.0
    vals = rng.standard_normal(N) * scale
    if dt.kind == "c":
        vals = vals + 1j * rng.standard_normal(N) * scale
    if name == "float8_e8m0fnu":
        vals = np.abs(vals) + 0.01  # unsigned exponent: positive values only
    arr = vals.astype(dt)
    arr[::997] = 0
    # NaN/Inf where the dtype has them (a dtype without Inf turns it into NaN or saturates).
    arr[5] = np.array(np.nan).astype(dt)
    arr[17] = np.array(np.inf).astype(dt)
    if name != "float8_e8m0fnu":
        arr[29] = np.array(-np.inf).astype(dt)
    return arr


def _reference(arr: np.ndarray) -> dict[str, float | int | None]:
    x = np.abs(arr.astype(np.complex128)) if arr.dtype.kind == "c" else arr.astype(np.float64)
    fin = x[np.isfinite(x)]
    ref: dict[str, float | int | None] = {
        "count": x.size,
        "finite": fin.size,
        "nan": int(np.isnan(x).sum()),
        "posinf": int(np.isposinf(x).sum()),
        "neginf": int(np.isneginf(x).sum()),
        "zeros": int((fin == 0).sum()),
    }
    ref.update(
        min=float(fin.min()),
        max=float(fin.max()),
        mean=float(fin.mean()),
        std=float(fin.std()),
        l2=float(np.sqrt(np.sum(fin * fin))),
    )
    return ref


def _check(got: dict, ref: dict) -> None:
    for k in ("count", "finite", "nan", "posinf", "neginf", "zeros", "min", "max"):
        assert got[k] == ref[k], (k, got[k], ref[k])
    for k in ("mean", "std", "l2"):
        assert math.isclose(got[k], ref[k], rel_tol=1e-9, abs_tol=1e-12), (k, got[k], ref[k])


DTYPES = [n for n in _core.dtype_names() if n != "float4_e2m1fn_x2"]


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_stats_equal_numpy_every_dtype(tmp_path, compression) -> None:
    rng = np.random.default_rng(7)
    tensors = {name: _random(name, rng) for name in DTYPES}
    p = str(tmp_path / "ck")
    sp.save_file(tensors, p, compression=compression, chunk_bytes=64 << 10)
    with sp.open(p) as r:
        got = r.stats()
    assert sorted(got) == sorted(tensors)
    for name, arr in tensors.items():
        ref = _reference(arr)
        assert got[name]["dtype"] == name and got[name]["shape"] == [N]
        _check(got[name], ref)
    # the planted values are seen where the dtype can hold them
    assert got["float32"]["nan"] == 1 and got["float32"]["posinf"] == 1
    assert got["bfloat16"]["neginf"] == 1
    assert got["float8_e4m3fn"]["posinf"] == 0 and got["float8_e4m3fn"]["nan"] >= 1


def test_float4_two_elements_per_byte() -> None:
    rng = np.random.default_rng(3)
    packed = rng.integers(0, 256, 10_001, dtype=np.uint8)
    got = _core.stats_buffer(packed, "float4_e2m1fn_x2")
    lo = (packed & 0xF).view(ml_dtypes.float4_e2m1fn)
    hi = (packed >> 4).view(ml_dtypes.float4_e2m1fn)
    ref = _reference(np.concatenate([lo, hi]))
    _check(dict(zip(sp.storage.STATS_FIELDS, got, strict=True)), ref)


def test_stats_keys_and_errors(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"a": np.ones(3, np.float32), "n": 7, "e": np.zeros(0, np.float32)}, p)
    with sp.open(p) as r:
        assert sorted(r.stats()) == ["a", "e"]  # the int is skipped
        e = r.stats(["e"])["e"]
        assert e["count"] == 0 and e["min"] is None and e["l2"] == 0.0
        with pytest.raises(sp.InvalidArgumentError, match="'n'"):
            r.stats(["n"])
        with pytest.raises(KeyError):
            r.stats(["missing"])


def test_stats_refuses_damaged_data(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"w": np.arange(100_000, dtype=np.float32)}, p, compression="none")
    shard = next(str(tmp_path / f) for f in os.listdir(tmp_path) if ".data-" in f)
    with sp.open(p) as r:
        off = r.info("w").offset
    with open(shard, "r+b") as f:
        f.seek(off + 40_000)
        f.write(b"\xff\xff\xff\x7f")
    with sp.open(p) as r, pytest.raises(sp.ChecksumMismatchError):
        r.stats()


def test_stats_hf_safetensors_file(tmp_path) -> None:
    from safetensors.numpy import save_file

    arr = np.random.default_rng(1).standard_normal(1000).astype(np.float16)
    arr[10] = np.nan
    f = str(tmp_path / "model.safetensors")
    save_file({"w": arr}, f)
    with sp.open(f) as r:
        _check(r.stats()["w"], _reference(arr))


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_cli_stats_exit_codes_and_json(tmp_path, capsys) -> None:
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    w = np.linspace(-1, 1, 1000, dtype=np.float32)
    sp.save_file({"net/w": w, "net/b": np.zeros(4, np.float32)}, good)
    broken = w.copy()
    broken[3] = np.nan
    sp.save_file({"net/w": broken, "net/b": np.zeros(4, np.float32)}, bad)

    code, out = _run(capsys, "stats", good)
    assert code == 0 and "net/w" in out and "0 with NaN/Inf" in out
    code, out = _run(capsys, "stats", bad)
    assert code == 2 and "NONFINITE" in out
    code, _ = _run(capsys, "stats", bad, "--no-fail")
    assert code == 0
    code, out = _run(capsys, "stats", bad, "--json", "--keys", "net/w*")
    doc = json.loads(out)
    assert code == 2 and doc["nonfinite"] == ["net/w"] and list(doc["tensors"]) == ["net/w"]
    t = doc["tensors"]["net/w"]
    assert set(t) == {"dtype", "shape", *sp.storage.STATS_FIELDS}
    assert t["nan"] == 1 and t["count"] == 1000 and t["max"] == 1.0
    code, _ = _run(capsys, "stats", str(tmp_path / "nothing"))
    assert code == 3


def test_stats_object_store_equals_local(tmp_path) -> None:
    rng = np.random.default_rng(11)
    t = {"w": rng.standard_normal(70_000).astype(np.float32), "i": np.arange(9, dtype=np.int16)}
    t["w"][3] = np.inf
    sp.save_file(t, "memory://inspect/ck", chunk_bytes=64 << 10)
    sp.save_file(t, str(tmp_path / "ck"), chunk_bytes=64 << 10)
    with sp.open("memory://inspect/ck") as remote, sp.open(str(tmp_path / "ck")) as local:
        got, ref = remote.stats(), local.stats()
        assert sorted(got) == ["i", "w"] and got["w"]["posinf"] == 1
        for k in got:  # pieces are merged in another grouping: equal to rounding
            _check(got[k], ref[k])
