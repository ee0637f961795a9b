"""``sptorch.load_into`` with many tensors: dtypes and shapes checked against the index in
one core call (``_all_match``), falling back to the key-by-key loop, with torch's wording, for
anything else (a shape mismatch, another dtype to cast to)."""

from __future__ import annotations

import pathlib

import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")

import shardpoint.torch as sptorch  # noqa: E402
from shardpoint.torch.inplace import _all_match  # noqa: E402

_N = 300


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    out = {f"blocks.{i:03d}.bias": torch.randn(16, generator=g) for i in range(_N)}
    out["head.weight"] = torch.randn(8, 4, generator=g).to(torch.bfloat16)
    return out


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("batched") / "ck")
    sptorch.save(_state(), prefix, compression="none")
    return prefix


def _zeros() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in _state().items()}


def test_many_tensors_load_through_the_batched_check(ck: str) -> None:
    target = _zeros()
    with sp.open(ck) as r:
        assert _all_match(r, [(t, k) for k, t in target.items()])  # the one-call path
    sptorch.load_into(target, ck)
    for k, v in _state().items():
        assert torch.equal(target[k], v), k


def test_a_shape_mismatch_among_many_names_the_key(ck: str) -> None:
    target = _zeros()
    target["blocks.299.bias"] = torch.zeros(17)
    with sp.open(ck) as r:
        assert not _all_match(r, [(t, k) for k, t in target.items()])
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks\.299\.bias: .*\[16\]"):
        sptorch.load_into(target, ck)
    assert not target["blocks.000.bias"].any()  # checked before anything was written


def test_another_dtype_or_a_non_contiguous_target_still_loads(ck: str) -> None:
    target = _zeros()
    target["head.weight"] = torch.zeros(8, 4)  # float32 model, bfloat16 stored: cast
    t = torch.zeros(16, 2)[:, 0]  # a strided view: copied, not decoded into
    target["blocks.005.bias"] = t
    sptorch.load_into(target, ck)
    state = _state()
    assert torch.equal(target["head.weight"], state["head.weight"].float())
    assert torch.equal(t, state["blocks.005.bias"])
    assert torch.equal(target["blocks.100.bias"], state["blocks.100.bias"])


def test_a_short_shard_names_the_file(ck: str, tmp_path: pathlib.Path) -> None:
    src = pathlib.Path(ck)
    for p in src.parent.glob(src.name + ".*"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    with sp.open(str(tmp_path / "ck")) as r:
        shard = pathlib.Path(r.format_info["shards"][0][0])
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(sp.CorruptCheckpointError, match=shard.name):
        sptorch.load_into(_zeros(), str(tmp_path / "ck"))
