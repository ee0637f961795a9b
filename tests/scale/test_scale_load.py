"""Resharded DCP loads at small N (docs/SCALE.md): a checkpoint saved by N = 64 simulated
ranks loaded by M = 48 through our StorageReader and LoadPlanner, each loading rank alone
against moto behind a counting proxy: the open is 2 requests (the index, DCP's metadata), the
data is one ranged GET per shard the rank's rows touch, and the bytes are the rank's own
(verify off: exactly its rows; verify on: the stored values it touches, whole, since an
uncompressed value has one crc). Every rank's tensors are checked bit-exact."""

from __future__ import annotations

import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("torch")

import scale_harness as h  # noqa: E402 - after the importorskips
from s3_server import Proxy, moto_environment, opts_for  # noqa: E402

N, M = 64, 48
TENSORS, ROWS, COLS = 4, 3, 16  # a stored value: 3 rows x 16 float32 = 192 bytes
LOADERS = [*range(0, M, 4), M - 1]  # the loading ranks measured (each alone, in turn)


@pytest.fixture(scope="module")
def saved():
    with moto_environment() as moto:
        proxy = Proxy(moto.port)
        try:
            url = f"s3://{moto.bucket()}/load/ckpt"
            opts = opts_for(proxy)
            h.dcp_save(url, N, tensors=TENSORS, rows=ROWS, cols=COLS, planner="ours", options=opts)
            yield moto, proxy, url, opts
        finally:
            proxy.close()


def _touched(j: int) -> int:
    """How many saving ranks hold rows of loading rank j (its N*ROWS/M rows)."""
    per = N * ROWS // M
    return len({r // ROWS for r in range(j * per, (j + 1) * per)})


@pytest.mark.parametrize("verify", [False, True])
def test_every_loading_rank_reads_only_its_bytes(saved: tuple, verify: bool) -> None:
    _, proxy, url, opts = saved
    run = h.dcp_load(
        url,
        N,
        M,
        tensors=TENSORS,
        rows=ROWS,
        cols=COLS,
        ranks=LOADERS,
        verify=verify,
        proxy=proxy,
        options=opts,
    )
    value = ROWS * COLS * 4
    for at, j in enumerate(LOADERS):
        assert run.open_requests[at] == {"GET": 2}, (j, run.open_requests[at])
        touched = _touched(j)
        data = run.data_requests[at]
        if verify:
            # every touched value downloaded whole, batched: one GET per touched shard
            assert data == {"GET": touched}, (j, data)
            assert run.data_bytes[at] == touched * TENSORS * value, (j, run.data_bytes[at])
        else:
            # the values it needs whole in one batched GET, the cut ones as row slices
            assert set(data) == {"GET"} and data["GET"] <= 1 + TENSORS * touched, (j, data)
            assert run.data_bytes[at] == run.needed_bytes[at], (j, run.data_bytes[at])


def test_our_plan_is_dcps_plan(saved: tuple) -> None:
    """The LoadPlanner picks the stored chunks by binary search; the read items it hands the
    StorageReader are the ones DCP's own planner makes (storage index hints included)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from shardpoint.torch.dcp import StorageReader
    from shardpoint.torch.dcp_load_planner import LoadPlanner

    _, _, url, opts = saved
    metadata = StorageReader(url, storage_options=opts).read_metadata()
    for j in (0, 1, 17, M - 1):
        plans = []
        for planner in (LoadPlanner(), DefaultLoadPlanner()):
            state = {f"t{i:03d}": h._loading_shard(j, M, N * ROWS, COLS) for i in range(TENSORS)}
            planner.set_up_planner(state, metadata, False)
            plans.append(planner.create_local_plan().items)
        ours, dcps = plans
        assert ours == dcps
        assert [i.storage_index.index for i in ours] == [i.storage_index.index for i in dcps]
        assert len(ours) == TENSORS * _touched(j)
    assert isinstance(metadata.state_dict_metadata["t000"].chunks[0].offsets, torch.Size)
