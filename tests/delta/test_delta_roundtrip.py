"""Delta round trips (docs/DELTA.md): apply(encode(a, b), a) == b bit for bit, and delta
checkpoints read back through their base, for every dtype (bf16, float8, float4 and NaN
payloads included: values drawn as raw bits by the testing kit)."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardpoint as sp
import shardpoint.delta as spd
import shardpoint.testing.strategies as sps
from shardpoint.testing._bits import NAMES

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A base tensor and a changed one of its dtype and shape: unchanged, a sparse change
    (some elements replaced by other drawn bits) or a dense one (all new bits)."""
    dtype = draw(st.sampled_from(sorted(NAMES)))
    shape = draw(sps.shapes())
    a = np.ascontiguousarray(draw(sps.tensors(dtype, shape, layout="contiguous")))
    other = np.ascontiguousarray(draw(sps.tensors(dtype, shape, layout="contiguous")))
    kind = draw(st.sampled_from(["same", "sparse", "dense"]))
    if kind == "same":
        return a, a.copy()
    if kind == "dense":
        return a, other
    mask = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).random(a.shape) < 0.05
    b = a.copy()
    b[mask] = other[mask]
    return a, b


def bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


@SETTINGS
@given(pair=pairs())
def test_sync_apply_of_encode_rebuilds_new_bitwise(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    blob = spd.encode({"t": a}, {"t": b})
    assert isinstance(blob, bytes)
    target = {"t": a.copy()}
    spd.apply(blob, target)
    assert target["t"].dtype == b.dtype and bits(target["t"]) == bits(b)


@SETTINGS
@given(pair=pairs())
def test_delta_checkpoint_reads_back_bitwise(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    with tempfile.TemporaryDirectory() as d:
        base, new = os.path.join(d, "base"), os.path.join(d, "new")
        sp.save_file({"t": a, "n": 7}, base, durable=False)
        sp.save_file({"t": b, "n": 8}, new, base=base, delta=True, durable=False)
        got = sp.load_file(new)
        assert bits(got["t"]) == bits(b) and got["n"] == 8
        with sp.open(new) as r:
            out = np.empty_like(b)
            r.load_into({"t": out})
            assert bits(out) == bits(b)
            if b.ndim >= 1 and b.shape[0] > 1:
                assert bits(r.slice("t", 1, b.shape[0])) == bits(b[1:])
                assert bits(r.get_slice("t")[::2]) == bits(b[::2])


def test_per_tensor_choice_and_sizes(tmp_path: os.PathLike[str]) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1024, 512)).astype(np.float32)
    old = {"frozen": w.copy(), "moved": w.copy(), "dense": w.copy(), "new_shape": w[:3].copy()}
    moved = w.copy()
    moved.reshape(-1)[::200] += 1e-3  # 0.5% of elements
    new = {
        "frozen": w.copy(),
        "moved": moved,
        "dense": rng.standard_normal(w.shape).astype(np.float32),
        "new_shape": w[:4].copy(),
        "added": np.ones(5, np.int64),
    }
    base, p = os.path.join(tmp_path, "b"), os.path.join(tmp_path, "p")
    sp.save_file(old, base)
    sp.save_file(new, p, base=base, delta=True)
    info = spd.describe(p)
    modes = {k: v["mode"] for k, v in info["tensors"].items()}
    assert modes == {"frozen": "same", "moved": "xor", "dense": "full", "new_shape": "full",
                     "added": "full"}  # fmt: skip
    assert info["tensors"]["frozen"]["stored_bytes"] == 0
    assert info["tensors"]["moved"]["stored_bytes"] < 0.03 * w.nbytes
    assert info["depth"] == 1 and info["base"] == os.path.abspath(base)
    for k, v in sp.load_file(p).items():
        assert bits(v) == bits(new[k])
    full = os.path.join(tmp_path, "full")
    spd.to_full(p, full)
    assert not spd.describe(full)
    for k, v in sp.load_file(full).items():
        assert bits(v) == bits(new[k])


def test_chain_is_resolved_and_bounded(tmp_path: os.PathLike[str]) -> None:
    x = np.arange(4096, dtype=np.float32)
    prev = os.path.join(tmp_path, "c0")
    sp.save_file({"x": x}, prev)
    depths = []
    for i in range(1, 5):
        x = x.copy()
        x[i] = -1.0
        p = os.path.join(tmp_path, f"c{i}")
        sp.save_file({"x": x}, p, base=prev, delta=True, max_chain=2)
        with sp.open(p) as r:
            depths.append(getattr(r, "delta_depth", 0))
            assert bits(r["x"]) == bits(x)
        prev = p
    assert depths == [1, 2, 0, 1]  # the third save would make a chain of 3: a full one
    assert spd.needed_bases(os.path.join(tmp_path, "c2")) == [
        os.path.abspath(os.path.join(tmp_path, n)) for n in ("c1", "c0")
    ]


def test_sync_of_torch_tensors_in_place() -> None:
    torch = __import__("pytest").importorskip("torch")
    g = torch.Generator().manual_seed(0)
    old = {"w": torch.randn(256, 64, generator=g).to(torch.bfloat16), "b": torch.zeros(3)}
    new = {k: v.clone() for k, v in old.items()}
    new["w"][::7, ::5] += 0.25
    target = {k: v.clone() for k, v in old.items()}
    storage = target["w"].untyped_storage().data_ptr()
    counts = spd.apply(spd.encode(old, new), target)
    assert counts["xor"] == 1 and counts["same"] == 1
    assert target["w"].untyped_storage().data_ptr() == storage  # written in place
    assert torch.equal(target["w"].view(torch.int16), new["w"].view(torch.int16))


def test_torch_save_with_delta_loads_back(tmp_path: os.PathLike[str]) -> None:
    torch = __import__("pytest").importorskip("torch")
    import shardpoint.torch as sptorch

    model = torch.nn.Linear(64, 32).to(torch.bfloat16)
    base, p = os.path.join(tmp_path, "b"), os.path.join(tmp_path, "p")
    sptorch.save(model, base)
    with torch.no_grad():
        model.weight[0, :4] += 1.0
    sptorch.save(model, p, base=base, delta=True)
    assert {v["mode"] for v in spd.describe(p)["tensors"].values()} == {"xor", "same"}
    got = sptorch.load(p)
    for k, v in model.state_dict().items():
        assert torch.equal(got[k].view(torch.int16), v.view(torch.int16))
