"""``sp.open(x, framework="pt"|"np"|"jax")``, safetensors' ``safe_open`` convention: torch
tensors (bfloat16 included) or jax arrays out, without the caller converting numpy."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import shardpoint as sp

ml_dtypes = pytest.importorskip("ml_dtypes")


def _ckpt(tmp_path: pathlib.Path) -> str:
    p = str(tmp_path / "ck")
    sp.save_file(
        {
            "bf16": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3),
            "f32": np.arange(8, dtype=np.float32).reshape(4, 2),
            "raw": np.arange(4, dtype=np.int64),
            "step": 7,
        },
        p,
    )
    sp.save_file({"raw": np.arange(4, dtype=np.int64)}, p + "_raw", compression="none")
    return p


def test_framework_pt(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    p = _ckpt(tmp_path)
    for fw in ("pt", "torch"):
        with sp.open(p, framework=fw) as r:
            t = r["bf16"]
            assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
            assert torch.equal(t, torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
            assert r.get("f32").dtype == torch.float32
            assert r["step"] == 7  # non-tensor values unchanged
            assert all(isinstance(v, torch.Tensor) for k, v in r.load().items() if k != "step")
            assert torch.equal(r.get_slice("f32")[1:3, 1], torch.tensor([3.0, 5.0]))
            assert torch.equal(r.slice("f32", 2, 4), torch.arange(4.0, 8.0).reshape(2, 2))
    with sp.open(p + "_raw", framework="pt") as r:  # uncompressed: zero-copy, writable COW
        t = r["raw"]
        t += 1
        assert t.tolist() == [1, 2, 3, 4]
    assert sp.load_file(p + "_raw")["raw"].tolist() == [0, 1, 2, 3]


def test_framework_pt_on_an_hf_directory(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    (tmp_path / "hf").mkdir()
    w = torch.randn(3, 4).to(torch.bfloat16)
    st.save_file({"w": w}, str(tmp_path / "hf" / "model.safetensors"))
    with sp.open(str(tmp_path / "hf"), framework="pt") as r:
        assert torch.equal(r["w"], w) and torch.equal(r.get_slice("w")[:, :2], w[:, :2])


def test_framework_np_is_the_default(tmp_path: pathlib.Path) -> None:
    p = _ckpt(tmp_path)
    for r in (sp.open(p), sp.open(p, framework="np"), sp.open(p, framework="numpy")):
        with r:
            assert isinstance(r["f32"], np.ndarray) and r["bf16"].dtype == ml_dtypes.bfloat16
    with pytest.raises(sp.InvalidArgumentError, match="framework"):
        sp.open(p, framework="tf")


def test_framework_jax(tmp_path: pathlib.Path) -> None:
    jax = pytest.importorskip("jax")
    p = _ckpt(tmp_path)
    with sp.open(p, framework="jax") as r:
        a = r["bf16"]
        assert isinstance(a, jax.Array) and a.dtype == jax.numpy.bfloat16
        assert np.array_equal(np.asarray(a, np.float32), np.arange(6.0).reshape(2, 3))


def test_open_framework_does_not_import_torch_for_numpy(tmp_path: pathlib.Path) -> None:
    p = _ckpt(tmp_path)
    code = (
        "import sys, shardpoint as sp\n"
        f"r = sp.open({p!r}); r.load(); r.close()\n"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
