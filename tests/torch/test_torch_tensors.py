"""shardpoint.torch.save / load: every dtype, shapes, views, shared storage, nesting, zero-copy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402

ALL_DTYPES = [
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
]


def random_tensor(dtype, shape, seed=0):
    """Arbitrary bit patterns (NaNs, infinities, subnormals included) of ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape, dtype=np.int64))
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def bits(t):
    """The tensor's bytes (bitwise comparison, NaN-safe)."""
    t = t.detach().contiguous().cpu()
    return (
        t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1).to(torch.uint8)
    )


def assert_bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_every_dtype_round_trips_bitwise(tmp_path, compression):
    shapes = [(), (0,), (7,), (3, 5), (2, 0, 3), (4, 3, 2)]
    state = {
        f"{str(dt).removeprefix('torch.')}/{i}": random_tensor(dt, shape, seed=i)
        for dt in ALL_DTYPES
        for i, shape in enumerate(shapes)
    }
    spt.save(state, tmp_path / "ck", compression=compression, durable=False)
    out = spt.load(tmp_path / "ck")
    assert list(out) == list(state)
    for key, value in state.items():
        assert_bitwise(out[key], value)
    with sp.open(tmp_path / "ck") as r:  # stored under the format's dtype names
        assert r.info("bfloat16/3").dtype == "bfloat16"
        assert r.info("float8_e5m2/3").dtype == "float8_e5m2"
        assert r.info("uint32/2").shape == (7,)


def test_uncompressed_load_is_zero_copy_copy_on_write(tmp_path):
    t = torch.arange(1 << 16, dtype=torch.float32)
    b = torch.randn(300, dtype=torch.float32).to(torch.bfloat16)
    spt.save({"t": t, "b": b}, tmp_path / "ck", compression="none", durable=False)
    out = spt.load(tmp_path / "ck")
    with sp.open(tmp_path / "ck") as r:
        arr = r["t"]
    # the tensor shares memory with the reader's array: both are views of the shard mapping
    assert out["t"].data_ptr() % 4096 == arr.ctypes.data % 4096
    shard = [f for f in (tmp_path).iterdir() if ".data-" in f.name][0]
    before = shard.read_bytes()
    out["t"][0] = -1.0  # writable, copy-on-write: the file is never written
    out["b"].add_(1)
    assert shard.read_bytes() == before
    assert spt.load(tmp_path / "ck")["t"][0].item() == 0.0
    assert out["b"].dtype == torch.bfloat16


def test_non_contiguous_and_views_are_saved_by_value(tmp_path):
    big = torch.randn(1000)
    state = {  # each tensor the only user of its storage (shared ones: the next tests)
        "t": torch.randn(6, 8, dtype=torch.float64).t(),
        "strided": torch.randn(6, 8)[::2, 1::3],
        "expanded": torch.randn(3, 1).expand(3, 4),
        "slice_of_big": big[10:20],
        "conj": torch.randn(4, dtype=torch.complex64).conj(),
        "neg": torch.randn(3).neg().conj(),  # real tensors ignore conj: a plain view
    }
    spt.save(state, tmp_path / "ck", durable=False)
    out = spt.load(tmp_path / "ck")
    for key, value in state.items():
        assert torch.equal(out[key], value.resolve_conj()), key
        assert out[key].is_contiguous()
    with sp.open(tmp_path / "ck") as r:  # only the view's 10 values, not big's storage
        assert r.info("slice_of_big").raw_bytes == 40


def test_shared_storage_comes_back_shared(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    emb = torch.randn(5, 3)
    state = {
        "base": base,
        "row": base[1],
        "transposed": base.t(),
        "tail": base.view(-1)[20:],
        "bytes_view": base.view(torch.int32)[2],  # another dtype over the same storage
        "emb": emb,
        "head": {"weight": emb},  # tied weights: the same tensor object twice
    }
    spt.save(state, tmp_path / "ck", durable=False)
    with sp.open(tmp_path / "ck") as r:
        assert "head/weight" not in r  # an exact alias is stored once
    out = spt.load(tmp_path / "ck")
    assert out["head"]["weight"] is out["emb"]
    ptr = out["base"].untyped_storage().data_ptr()
    for key in ("row", "transposed", "tail", "bytes_view"):
        assert out[key].untyped_storage().data_ptr() == ptr, key
        assert torch.equal(out[key], state[key]), key
    assert out["transposed"].stride() == (1, 6)
    out["base"][1, 0] = 100.0  # writes through a view are seen by the others, as before saving
    assert out["row"][0].item() == 100.0 and out["transposed"][0, 1].item() == 100.0
    assert out["tail"].storage_offset() == 20


def test_overlapping_views_without_a_covering_tensor(tmp_path):
    storage = torch.arange(10, dtype=torch.int64)
    state = {"a": storage[:6], "b": storage[4:]}
    spt.save(state, tmp_path / "ck", durable=False)
    out = spt.load(tmp_path / "ck")
    assert torch.equal(out["a"], storage[:6]) and torch.equal(out["b"], storage[4:])
    out["a"][5] = -5
    assert out["b"][1].item() == -5


def test_nested_state_dict_and_typed_leaves(tmp_path):
    state = {
        "model": {"l1.weight": torch.ones(2, 2), "l1.bias": torch.zeros(2)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1], "name": None}],
        },
        "epoch": 7,
        "flags": {True: "yes", "a/b": b"\x00\x01"},
        "shape": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "array": np.arange(4, dtype=np.int16),
        "empty": {},
        "lst": [],
    }
    spt.save(state, tmp_path / "ck", durable=False)
    out = spt.load(tmp_path / "ck")
    assert out["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert list(out["optimizer"]["state"]) == [0]
    assert torch.equal(out["optimizer"]["state"][0]["exp_avg"], torch.ones(2))
    assert out["epoch"] == 7 and out["flags"] == {True: "yes", "a/b": b"\x00\x01"}
    assert out["shape"] == torch.Size([2, 3]) and isinstance(out["shape"], torch.Size)
    assert out["dtype"] is torch.bfloat16
    assert isinstance(out["array"], np.ndarray) and out["array"].dtype == np.int16
    assert out["empty"] == {} and out["lst"] == []
    with sp.open(tmp_path / "ck") as r:
        assert "flags/a/b" in r and "model/l1.weight" in r and "optimizer/state/0/step" in r
    flat = spt.load(tmp_path / "ck", keys=["model/l1.bias", "epoch"])
    assert list(flat) == ["model/l1.bias", "epoch"] and flat["epoch"] == 7


def test_module_parameters_and_device_argument(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    spt.save(net, tmp_path / "ck", durable=False)  # an object with state_dict() is accepted
    out = spt.load(tmp_path / "ck", device=torch.device("cpu"))
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    fresh.load_state_dict(out)
    for a, b in zip(net.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not out["0.weight"].requires_grad
    # a device that needs a move: "meta" keeps shapes and dtypes, shared views stay views
    shared = torch.arange(6.0)
    spt.save({"a": shared, "b": shared[2:]}, tmp_path / "m", durable=False)
    moved = spt.load(tmp_path / "m", device="meta")
    assert moved["a"].device.type == "meta" and moved["b"].shape == (4,)
    assert moved["b"].untyped_storage().data_ptr() == moved["a"].untyped_storage().data_ptr()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_unsupported_values_are_refused_without_pickling(tmp_path):
    with pytest.raises(sp.UnsupportedDTypeError, match="never pickles"):
        spt.save({"f": object()}, tmp_path / "x")
    with pytest.raises(sp.UnsupportedDTypeError):
        spt.save({"s": torch.zeros(3).to_sparse()}, tmp_path / "x")
    with pytest.raises(sp.UnsupportedDTypeError):
        spt.save({"c": torch.zeros(2, dtype=torch.complex32)}, tmp_path / "x")
    with pytest.raises(sp.DuplicateKeyError):
        spt.save({"a/b": torch.zeros(1), "a": {"b": torch.ones(1)}}, tmp_path / "x")
    assert not sp.exists(tmp_path / "x")


def test_plain_checkpoints_load_as_flat_tensors(tmp_path):
    sp.save_file({"w": np.ones((2, 2), np.float32), "n": 3}, tmp_path / "plain", durable=False)
    out = spt.load(tmp_path / "plain")
    assert isinstance(out["w"], torch.Tensor) and out["n"] == 3


def test_import_shardpoint_does_not_import_torch():
    code = "import sys, shardpoint; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import shardpoint.torch\nexcept ImportError as e:\n"
        "    assert 'shardpoint[torch]' in str(e), e\nelse:\n    raise SystemExit('no error')"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shared_storage_loads_under_deterministic_algorithms(tmp_path):
    """torch.use_deterministic_algorithms(True) (Lightning's deterministic=True) makes
    torch.empty fill new memory, which float4 does not implement: rebuilding views that share
    one storage must not depend on it."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for dt in (torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.bfloat16, torch.float32):
            base = torch.arange(32, dtype=torch.uint8).view(dt)
            p = str(tmp_path / f"{str(dt).split('.')[-1]}.pt")
            spt.save({"a": base, "b": base[1:3]}, p)
            out = spt.load(p)
            assert torch.equal(out["a"].view(torch.uint8), base.view(torch.uint8)), dt
            assert torch.equal(out["b"].view(torch.uint8), base[1:3].view(torch.uint8)), dt
            assert out["b"].untyped_storage().data_ptr() == out["a"].untyped_storage().data_ptr()
    finally:
        torch.use_deterministic_algorithms(before)
