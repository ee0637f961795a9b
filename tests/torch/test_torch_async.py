"""Asynchronous torch saves (issue 13): ``shardpoint.torch.save(..., blocking=False)``, CUDA
staging through pinned memory, and ``torch.distributed.checkpoint.async_save`` with our
``StorageWriter`` in one process and in 2 gloo ranks (real processes)."""

from __future__ import annotations

import os
from concurrent.futures import Future

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import torch.distributed.checkpoint as dcp  # noqa: E402
from test_torch_distributed import guarded, init, run_ranks  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402


def _model_state() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(4, 64, generator=g)).sum().backward()
    opt.step()
    return {
        "model": net.state_dict(),
        "optim": opt.state_dict(),
        "bf16": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "strided": torch.randn(16, 16, generator=g)[:, ::2],
        "step": 3,
    }


def _clone(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone(v) for v in x]
    return x


def _scramble(x: object) -> None:
    if isinstance(x, torch.Tensor):
        x.add_(1) if x.dtype != torch.bool else x.logical_not_()
    elif isinstance(x, dict):
        for v in x.values():
            _scramble(v)
    elif isinstance(x, list):
        for v in x:
            _scramble(v)


def _assert_same(a: object, b: object, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(
            a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
            b.view(torch.uint8) if b.dtype == torch.bfloat16 else b,
        ), path
    elif isinstance(a, dict):
        assert set(map(str, a)) == set(map(str, b)), path
        bb = {str(k): v for k, v in b.items()}
        for k, v in a.items():
            _assert_same(v, bb[str(k)], f"{path}/{k}")
    else:
        assert a == b, path


def test_torch_save_nonblocking_snapshot(tmp_path):
    state = _model_state()
    want = _clone(state)
    fut = spt.save(state, tmp_path / "c", blocking=False)
    assert isinstance(fut, Future)
    _scramble(state)  # every tensor modified in place right after the call
    assert fut.result(timeout=120) is None
    _assert_same(want, spt.load(tmp_path / "c"))


def test_torch_save_nonblocking_commits_in_order(tmp_path):
    x = torch.zeros(1 << 16)
    futs = []
    for i in range(4):
        x.fill_(i)
        futs.append(spt.save({"x": x, "i": i}, tmp_path / "c", blocking=False))
    for f in futs:
        f.result(timeout=120)
    got = spt.load(tmp_path / "c")
    assert got["i"] == 3 and bool((got["x"] == 3).all())


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)"
)
def test_torch_save_nonblocking_cuda_snapshot_through_pinned_memory(tmp_path):  # pragma: no cover
    from shardpoint.torch.staging import TorchStagingBuffers

    dev = torch.device("cuda")
    w = torch.randn(1024, 1024, device=dev)
    h = torch.randn(77, 5, device=dev).to(torch.bfloat16)
    want_w, want_h = w.cpu(), h.cpu()
    fut = spt.save({"w": w, "h": h, "cpu": torch.arange(4)}, tmp_path / "c", blocking=False)
    w.mul_(-3)  # enqueued after the save call: must run after the copy on the side stream
    h.zero_()
    fut.result(timeout=120)
    got = spt.load(tmp_path / "c")
    assert torch.equal(got["w"], want_w)
    assert torch.equal(got["h"].view(torch.int16), want_h.view(torch.int16))
    bufs = TorchStagingBuffers()
    bufs.stage_devices({"w": w})[1]()
    assert bufs._pinned["w"].is_pinned()
    n = bufs.allocations
    bufs.stage_devices({"w": w})[1]()
    assert bufs.allocations == n  # warm: pinned buffers reused


# ---- torch.distributed.checkpoint.async_save ---------------------------------------------------


def _dcp_state(rank: int) -> dict[str, object]:
    return {
        "model": {"w": torch.arange(1 << 14, dtype=torch.float32) + rank, "b": torch.ones(7)},
        "step": 5,
    }


def test_dcp_async_save_single_process(tmp_path):
    state = _dcp_state(0)
    want = _clone(state)
    fut = dcp.async_save(state, storage_writer=spt.StorageWriter(str(tmp_path / "ckpt")))
    fut.result(timeout=120)
    _scramble(state)
    target = {"model": {"w": torch.zeros(1 << 14), "b": torch.zeros(7)}, "step": 0}
    dcp.load(target, storage_reader=spt.StorageReader(str(tmp_path / "ckpt")))
    _assert_same(want, target)
    assert sp.exists(str(tmp_path / "ckpt"))


def _async_worker(rank: int, port: int, work: str) -> None:
    init(rank, port)
    state = {f"r{rank}": torch.full((128, 64), float(rank + 1)), "shared_step": 9}
    fut = dcp.async_save(state, storage_writer=spt.StorageWriter(f"{work}/ckpt"))
    fut.result(timeout=120)
    state[f"r{rank}"].zero_()
    dist.barrier()
    target = {f"r{rank}": torch.zeros(128, 64), "shared_step": 0}
    dcp.load(target, storage_reader=spt.StorageReader(f"{work}/ckpt"))
    assert torch.equal(target[f"r{rank}"], torch.full((128, 64), float(rank + 1)))
    assert target["shared_step"] == 9
    dist.barrier()


def async_worker(rank: int, port: int, work: str) -> None:
    guarded(_async_worker, rank, port, work)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_dcp_async_save_two_gloo_ranks(tmp_path):
    codes = run_ranks(async_worker, str(tmp_path))
    assert codes == [0, 0]
    with sp.open(str(tmp_path / "ckpt")) as r:
        r.verify()
        keys = r.keys()
    assert any("r0" in k for k in keys) and any("r1" in k for k in keys)
    assert os.path.exists(str(tmp_path / "ckpt") + ".index")
    arr = {
        k: v for k, v in sp.load_file(str(tmp_path / "ckpt")).items() if isinstance(v, np.ndarray)
    }
    assert arr


def test_manager_nonblocking_snapshot_of_module_and_optimizer(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.randn(8, 32)).sum().backward()
    opt.step()
    want = _clone({"model": net.state_dict(), "optim": opt.state_dict()})
    mgr = sp.CheckpointManager(sp.Checkpoint(model=net, optimizer=opt), str(tmp_path))
    fut = mgr.save(blocking=False)
    for _ in range(2):  # training goes on at once: weights and Adam moments change in place
        opt.zero_grad()
        net(torch.randn(8, 32)).sum().backward()
        opt.step()
    path = fut.result(120)
    torch.manual_seed(1)
    net2 = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt2 = torch.optim.Adam(net2.parameters(), lr=0.1)
    sp.Checkpoint(model=net2, optimizer=opt2).restore(path).assert_consumed()
    _assert_same(want["model"], net2.state_dict())
    got_opt = opt2.state_dict()
    for pid, st in want["optim"]["state"].items():
        _assert_same(st, got_opt["state"][pid], f"optim/{pid}")
