"""Resharded DCP loads at small N (docs/SCALE.md): a checkpoint saved by N = 64 simulated
ranks loaded by M = 48 through our StorageReader and LoadPlanner, each loading rank alone
against moto behind a counting proxy: the open is 2 requests (the index, DCP's metadata) and,
with values this tiny (192 bytes), the data is one ranged GET per shard the rank's rows touch.
At a size where alignment does not dominate (N = 8 -> M = 6, 800 KB per loading rank and
tensor, rows not aligned to the 16 KiB crc blocks), a rank reads at most 1.05x its own bytes
with ``verify`` on: a row slice reads and checks only the crc blocks holding its rows
(FORMAT.md §3.4). Every rank's tensors are checked bit-exact; a flipped byte in a block a
slice reads is found and named."""

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
        # every read of a shard in one ranged GET: the parts of its values the rank skips
        # are alignment-sized here, cheaper to download than to ask for separately
        assert run.data_requests[at] == {"GET": touched}, (j, run.data_requests[at])
        # a value of one crc block (192 bytes) is read whole when checked
        assert run.data_bytes[at] <= touched * TENSORS * value, (j, run.data_bytes[at])
        assert run.data_bytes[at] >= run.needed_bytes[at], (j, run.data_bytes[at])


#: The realistic size: 3 rows of 50,000 float32 per saving rank (600 KB values), 4 rows per
#: loading rank (800 KB per tensor); a row (200,000 B) is not a multiple of the 16 KiB crc
#: block, so the ranks' cuts fall inside blocks.
BIG_N, BIG_M, BIG_TENSORS, BIG_COLS = 8, 6, 2, 50_000


@pytest.fixture(scope="module")
def saved_big():
    with moto_environment() as moto:
        proxy = Proxy(moto.port)
        try:
            url = f"s3://{moto.bucket()}/big/ckpt"
            opts = opts_for(proxy)
            h.dcp_save(
                url, BIG_N, tensors=BIG_TENSORS, rows=ROWS, cols=BIG_COLS, planner="ours",
                options=opts,
            )  # fmt: skip
            yield moto, proxy, url, opts
        finally:
            proxy.close()


def test_checked_loads_read_at_most_105_percent(saved_big: tuple) -> None:
    _, proxy, url, opts = saved_big
    run = h.dcp_load(
        url, BIG_N, BIG_M, tensors=BIG_TENSORS, rows=ROWS, cols=BIG_COLS, verify=True,
        proxy=proxy, options=opts,
    )  # fmt: skip
    per = BIG_N * ROWS // BIG_M
    for j in range(BIG_M):
        touched = len({r // ROWS for r in range(j * per, (j + 1) * per)})
        assert run.open_requests[j] == {"GET": 2}, (j, run.open_requests[j])
        # at most one GET per tensor and shard touched: the parts skipped are too large to
        # download along (more than 1/40 of what the GET is for)
        assert run.data_requests[j]["GET"] <= BIG_TENSORS * touched, (j, run.data_requests[j])
        amplification = run.data_bytes[j] / run.needed_bytes[j]
        assert 1.0 <= amplification <= 1.05, (j, run.data_bytes[j], run.needed_bytes[j])
        # a cut value read whole (one crc for all of it) would make it 1.5x here
    total = sum(run.data_bytes) / sum(run.needed_bytes)
    assert total <= 1.05, total


def test_a_flipped_byte_in_a_block_a_slice_reads_is_found(saved_big: tuple) -> None:
    """A damaged byte of a shard on the object store: the row slice whose blocks hold it
    fails naming the key and the block; a slice of other blocks of the same value reads."""
    import numpy as np

    import shardpoint as sp

    moto, _, url, opts = saved_big
    bucket = url.split("/")[2]
    dst = f"s3://{bucket}/flip/ckpt"
    value = np.arange(200_000, dtype=np.float32).reshape(1000, 200)  # 800 B rows, 49 blocks
    sp.save_file({"w": value}, dst, compression="none", storage_options=opts)
    with sp.open(dst, storage_options=opts) as r:
        info = r.info("w")
        assert info.crc_blocks == 49
    shard = next(k for k in moto.keys(bucket) if k.startswith("flip/ckpt.data-"))
    body = bytearray(moto.s3.get_object(Bucket=bucket, Key=shard)["Body"].read())
    body[info.offset + 5 * 16384 + 3] ^= 0x01  # block 5: raw bytes [81920, 98304): rows 102-122
    moto.s3.put_object(Bucket=bucket, Key=shard, Body=bytes(body))
    with sp.open(dst, storage_options=opts) as r:
        assert np.array_equal(r.slice("w", 0, 100), value[:100])
        assert np.array_equal(r.slice("w", 130, 1000), value[130:])
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "w" crc block 5'):
            r.slice("w", 110, 111)
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "w" crc block 5'):
            r["w"]  # a whole download checks its blocks in the same pass as its crc
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "w" crc block 5'):
            r.verify()


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
