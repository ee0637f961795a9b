"""The scale harness (docs/SCALE.md): N simulated ranks save one checkpoint through exactly the
code a real rank calls, and the coordinator's side is measured.

Ranks are threads (a tiny payload each: ``tensors`` float32 vectors of ``elems`` values), so
thousands of them fit on one machine. Two paths:

- ``writer``: each rank runs ``sp.Writer(prefix, rank=r, world_size=N)`` + ``add`` + ``commit``
  (its shard and partial index), then the coordinator runs ``sp.merge``;
- ``dcp``: each rank's ``SavePlan`` is the one DCP's planners produce for a row-sharded tensor
  (one ``WriteItem`` of type SHARD per tensor, offsets ``r * rows``); the coordinator runs
  DCP's ``DefaultSavePlanner.create_global_plan`` over the N plans and our
  ``StorageWriter.prepare_global_plan``; each rank runs our ``StorageWriter.write_data``; the
  coordinator runs ``StorageWriter.finish`` (metadata entry + merge). Plans and results are
  pickled as DCP's gather/scatter would send them, for the bytes per rank.

Requests are counted by a counting proxy in front of a moto S3 server (tests/s3_server.py) when
``proxy`` is given; ``latency`` seconds are added per request there. Coordinator CPU is
``time.process_time`` around the coordinator's calls: meaningful against a local directory
(against moto, the server runs in this process and its CPU is counted too). The merge's
cleanup runs in the background (FORMAT.md §8.3): each save waits for it after its commit was
measured and reports how long it still ran (``cleanup_wall``).
"""

from __future__ import annotations

import gc
import os
import pickle
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import shardpoint as sp

#: threads running the simulated ranks
RANK_THREADS = 8


@dataclass
class SaveRun:
    """What one simulated save measured."""

    path: str
    n: int
    coordinator_cpu_s: float
    commit_wall_s: float
    save_wall_s: float
    #: requests of the ranks' phase, divided by N, by S3 operation (empty against a directory)
    rank_requests: dict[str, float] = field(default_factory=dict)
    #: requests of the coordinator's commit, by S3 operation
    commit_requests: dict[str, int] = field(default_factory=dict)
    #: objects (or files) the checkpoint left per rank
    objects_per_rank: float = 0.0
    #: bytes each rank sends to / receives from the coordinator (DCP: pickled plans, results)
    bytes_to_coordinator: float = 0.0
    bytes_from_coordinator: float = 0.0
    #: coordinator CPU split by step, for the report
    steps: dict[str, float] = field(default_factory=dict)
    #: DCP: every rank's final plan (what the next save of an unchanged layout reuses)
    final_plans: list[Any] = field(default_factory=list, repr=False)


def _tensors(rank: int, tensors: int, elems: int) -> dict[str, np.ndarray]:
    return {
        f"r{rank:05d}/t{i:03d}": np.full(elems, rank * 1000 + i, dtype=np.float32)
        for i in range(tensors)
    }


def _per_rank(counts: dict[str, int], n: int) -> dict[str, float]:
    return {k: v / n for k, v in sorted(counts.items())}


def _count_objects(prefix: str, proxy: Any, moto: Any) -> int:
    if not prefix.startswith("s3://"):
        d, base = os.path.split(prefix)
        n = sum(1 for f in os.listdir(d) if f.startswith(base) and os.path.isfile(f"{d}/{f}"))
        # hashed shards (FORMAT.md §3.1.1) under prefix/HH/
        return n + sum(len(fs) for _, _, fs in os.walk(prefix))
    if moto is None:
        return 0
    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    return sum(1 for k in moto.keys(bucket) if k.startswith(key))


def _wait_for_cleanup() -> float:
    """Wait for the merge's background cleanup (FORMAT.md §8.3) and return how long it still
    ran: off the coordinator's critical path, so not in its CPU; waited for here so that it
    is not counted in the next save's, and so that the files counted are the checkpoint's."""
    t0 = time.perf_counter()
    sp.wait_for_cleanups()
    return time.perf_counter() - t0


def _in_ranks(n: int, fn: Callable[[int], Any]) -> list[Any]:
    with ThreadPoolExecutor(min(RANK_THREADS, n)) as pool:
        return list(pool.map(fn, range(n)))


def writer_save(
    prefix: str,
    n: int,
    *,
    tensors: int = 100,
    elems: int = 4,
    proxy: Any = None,
    moto: Any = None,
    options: dict[str, str] | None = None,
    token: str = "s",
    hashed_prefixes: bool = False,
) -> SaveRun:
    """N ranks through ``sp.Writer(rank=, world_size=)``, then ``sp.merge`` on the coordinator.
    ``hashed_prefixes``: the ranks' shards under ``prefix/HH/`` (FORMAT.md §3.1.1)."""

    def rank_save(r: int) -> None:
        with sp.Writer(
            prefix,
            rank=r,
            world_size=n,
            compression="none",
            merge_token=token,
            storage_options=options,
            hashed_prefixes=hashed_prefixes,
        ) as w:
            for k, v in _tensors(r, tensors, elems).items():
                w.add(k, v)

    t0 = time.perf_counter()
    if proxy is not None:
        proxy.reset()
    _in_ranks(n, rank_save)
    rank_counts = proxy.counts() if proxy is not None else {}
    if proxy is not None:
        proxy.reset()
    c0, w0 = time.process_time(), time.perf_counter()
    # the opt-in background cleanup (FORMAT.md §8.3), waited for below outside the measurement
    sp.merge(
        prefix, n, token=token, storage_options=options, wait_cleanup=False,
        hashed_prefixes=hashed_prefixes,
    )  # fmt: skip
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    cleanup = _wait_for_cleanup()
    return SaveRun(
        path="writer",
        n=n,
        coordinator_cpu_s=cpu,
        commit_wall_s=wall,
        save_wall_s=time.perf_counter() - t0,
        rank_requests=_per_rank(rank_counts, n),
        commit_requests=proxy.counts() if proxy is not None else {},
        objects_per_rank=_count_objects(prefix, proxy, moto) / n,
        steps={"merge": cpu, "cleanup_wall": cleanup},
    )


# --------------------------------------------------------------------------------------------
# DCP
# --------------------------------------------------------------------------------------------


def dcp_rank_plans(n: int, tensors: int, rows: int, cols: int) -> list[Any]:
    """The SavePlans DCP's planner makes for N ranks each holding rows ``[r*rows, (r+1)*rows)``
    of ``tensors`` row-sharded float32 tensors of shape ``(n*rows, cols)`` (FSDP's layout):
    the WriteItems ``_create_write_items_for_dtensor`` builds for such shards."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    props = TensorProperties(dtype=torch.float32)
    size = torch.Size([n * rows, cols])
    plans = []
    for r in range(n):
        offsets = torch.Size([r * rows, 0])
        items = [
            WriteItem(
                index=MetadataIndex(f"t{i:03d}", offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([rows, cols])),
                    properties=props,
                    size=size,
                ),
            )
            for i in range(tensors)
        ]
        plans.append(SavePlan(items, planner_data={}))
    return plans


class _Shards:
    """The rank side's data source: what ``planner.resolve_data`` hands ``write_data``."""

    def __init__(self, rank: int, rows: int, cols: int) -> None:
        import torch

        self.value = torch.full((rows, cols), float(rank))

    def resolve_data(self, item: Any) -> Any:
        return self.value


def dcp_save(
    prefix: str,
    n: int,
    *,
    tensors: int = 100,
    rows: int = 1,
    cols: int = 4,
    planner: Any = None,
    plans: list[Any] | None = None,
    previous: SaveRun | None = None,
    proxy: Any = None,
    moto: Any = None,
    options: dict[str, str] | None = None,
) -> SaveRun:
    """One DCP save of N simulated ranks: the coordinator's global planning (``planner``,
    default a fresh ``DefaultSavePlanner``; ``"ours"``: shardpoint's ``dcp_planners.SavePlanner``),
    our StorageWriter's ``prepare_global_plan`` / ``write_data`` / ``finish``.

    ``previous``: the run of the same planner before, whose layout this save keeps: every rank
    sends the empty, unusable plan a plan cache sends for an unchanged layout, and takes its
    previous final plan back with this save's storage data (``SavePlanner.finish_plan``)."""
    import dataclasses

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import SavePlan

    from shardpoint.torch import dcp as dcp_module
    from shardpoint.torch.dcp import StorageWriter
    from shardpoint.torch.dcp_planners import SavePlanner

    if previous is not None:
        plans = [SavePlan([], usable=False)] * n
    plans = plans if plans is not None else dcp_rank_plans(n, tensors, rows, cols)
    if planner is None or planner == "dcp":
        planner = DefaultSavePlanner()
        planner.set_up_planner({}, None, True)
    elif planner == "ours":
        planner = SavePlanner()
        planner.set_up_planner({}, None, True)
    coord = StorageWriter(
        prefix, compression="none", threads=1, storage_options=options, background_cleanup=True
    )
    coord.set_up_storage_writer(True, rank=0)
    gc.collect()  # the previous run's garbage is not this coordinator's cost
    t0 = time.perf_counter()
    sent = sum(len(pickle.dumps(p)) for p in plans)  # DCP gathers these on the coordinator
    c0 = time.process_time()
    global_plans, metadata = planner.create_global_plan(plans)
    c1 = time.process_time()
    global_plans = coord.prepare_global_plan(global_plans)
    c2 = time.process_time()
    received = sum(len(pickle.dumps(p)) for p in global_plans)  # scattered back
    if proxy is not None:
        proxy.reset()

    def rank_write(r: int) -> list[Any]:
        w = StorageWriter(prefix, compression="none", threads=1, storage_options=options)
        w.set_up_storage_writer(r == 0, rank=r)
        plan = global_plans[r]
        if not plan.usable:
            assert previous is not None, "a cached plan without a previous save"
            plan = dataclasses.replace(
                previous.final_plans[r], storage_data=plan.storage_data, usable=True
            )
        final[r] = plan
        return list(w.write_data(plan, _Shards(r, rows, cols)).value())  # type: ignore[arg-type]

    final: list[Any] = [None] * n
    results = _in_ranks(n, rank_write)
    sent += sum(len(pickle.dumps(r)) for r in results)  # gathered for finish
    rank_counts = proxy.counts() if proxy is not None else {}
    if proxy is not None:
        proxy.reset()
    merge_cpu = [0.0]
    real_merge = dcp_module.storage.merge

    def timed_merge(*a: Any, **k: Any) -> None:  # the merge's share of finish
        m0 = time.process_time()
        try:
            real_merge(*a, **k)
        finally:
            merge_cpu[0] += time.process_time() - m0

    dcp_module.storage.merge = timed_merge  # type: ignore[attr-defined]
    try:
        c3, w0 = time.process_time(), time.perf_counter()
        coord.finish(metadata, results)
        c4, wall = time.process_time(), time.perf_counter() - w0
    finally:
        dcp_module.storage.merge = real_merge  # type: ignore[attr-defined]
    cleanup = _wait_for_cleanup()
    return SaveRun(
        path="dcp",
        n=n,
        coordinator_cpu_s=(c2 - c0) + (c4 - c3),
        commit_wall_s=wall,
        save_wall_s=time.perf_counter() - t0,
        rank_requests=_per_rank(rank_counts, n),
        commit_requests=proxy.counts() if proxy is not None else {},
        objects_per_rank=_count_objects(prefix, proxy, moto) / n,
        bytes_to_coordinator=sent / n,
        bytes_from_coordinator=received / n,
        steps={
            "global_plan": c1 - c0,
            "prepare_global_plan": c2 - c1,
            "finish": c4 - c3,
            "of_which_merge": merge_cpu[0],
            "cleanup_wall": cleanup,
        },
        final_plans=final,
    )


def check_writer_checkpoint(
    prefix: str, n: int, tensors: int, elems: int, options: dict[str, str] | None = None
) -> None:
    """Every value of a ``writer_save`` checkpoint is there and bit-exact."""
    got = sp.load_file(prefix, storage_options=options)
    assert len(got) == n * tensors, (len(got), n * tensors)
    for r in range(n):
        for k, v in _tensors(r, tensors, elems).items():
            np.testing.assert_array_equal(got[k], v)


# --------------------------------------------------------------------------------------------
# DCP load, resharded N -> M
# --------------------------------------------------------------------------------------------


@dataclass
class LoadRun:
    """What the loading ranks of one resharded DCP load measured (each rank loaded alone, one
    after the other, so that its requests and bytes are its own)."""

    planner: str
    n: int
    m: int
    #: per loading rank measured: CPU of opening the checkpoint and decoding DCP's metadata
    #: (s), of the local plan (s); requests and bytes (GET bodies) of the open (index and
    #: metadata) and of the data reads; bytes of the rank's tensors
    read_metadata_cpu_s: list[float] = field(default_factory=list)
    plan_cpu_s: list[float] = field(default_factory=list)
    open_requests: list[dict[str, int]] = field(default_factory=list)
    open_bytes: list[int] = field(default_factory=list)
    data_requests: list[dict[str, int]] = field(default_factory=list)
    data_bytes: list[int] = field(default_factory=list)
    needed_bytes: list[int] = field(default_factory=list)


def _loading_shard(j: int, m: int, total_rows: int, cols: int) -> Any:
    """Loading rank ``j`` of ``m``'s rows of a ``(total_rows, cols)`` tensor, as DCP's
    checkpointable-tensor protocol describes a local shard of a global tensor (no process
    group needed)."""
    import torch

    rows = total_rows // m
    t = torch.zeros(rows, cols)
    t.global_shape = (total_rows, cols)  # type: ignore[attr-defined]
    t.global_offsets = ((j * rows, 0),)  # type: ignore[attr-defined]
    t.local_offsets = ((0, 0),)  # type: ignore[attr-defined]
    t.local_sizes = ((rows, cols),)  # type: ignore[attr-defined]
    return t


def dcp_load(
    prefix: str,
    n: int,
    m: int,
    *,
    tensors: int = 100,
    rows: int = 1,
    cols: int = 4,
    planner: str = "ours",
    ranks: list[int] | None = None,
    verify: bool = True,
    proxy: Any = None,
    options: dict[str, str] | None = None,
    collect: bool = False,
) -> LoadRun:
    """Load a ``dcp_save`` checkpoint of ``n`` ranks into ``m`` row-sharded ranks through our
    StorageReader and ``planner`` (``"ours"``: shardpoint's LoadPlanner; ``"dcp"``: DCP's
    DefaultLoadPlanner), rank by rank (``ranks``: which; default all), each checked bit-exact.
    The steps are DCP's ``load`` for one rank: read_metadata, set_up, local plan, (the global
    load step returns the plans as they are), finish_plan, read_data. ``collect``: collect the
    garbage before each rank's timing (the bench; a tenth of a second each, too slow for tests)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from shardpoint.torch.dcp import StorageReader
    from shardpoint.torch.dcp_load_planner import LoadPlanner

    total = n * rows
    if total % m:
        raise ValueError(f"{total} rows do not split over {m} loading ranks")
    run = LoadRun(planner=planner, n=n, m=m)
    for j in ranks if ranks is not None else range(m):
        state = {f"t{i:03d}": _loading_shard(j, m, total, cols) for i in range(tensors)}
        p = LoadPlanner() if planner == "ours" else DefaultLoadPlanner()
        reader = StorageReader(prefix, verify=verify, storage_options=options)
        if collect:
            gc.collect()
        if proxy is not None:
            proxy.reset()
        c0 = time.process_time()
        metadata = reader.read_metadata()
        reader.set_up_storage_reader(metadata, j == 0)
        p.set_up_planner(state, metadata, j == 0)
        c1 = time.process_time()
        if proxy is not None:
            run.open_requests.append(proxy.counts())
            run.open_bytes.append(sum(b for _, b in proxy.got))
            proxy.reset()
        plan = reader.prepare_local_plan(p.create_local_plan())
        c2 = time.process_time()
        (plan,) = reader.prepare_global_plan(p.create_global_plan([plan]))
        reader.read_data(p.finish_plan(plan), p).wait()
        run.read_metadata_cpu_s.append(c1 - c0)
        run.plan_cpu_s.append(c2 - c1)
        if proxy is not None:
            run.data_requests.append(proxy.counts())
            run.data_bytes.append(sum(b for _, b in proxy.got))
        mine = total // m
        run.needed_bytes.append(tensors * mine * cols * 4)
        want = (torch.arange(j * mine, (j + 1) * mine) // rows).float()[:, None].expand(mine, cols)
        for name, t in state.items():
            assert torch.equal(t, want), (name, j)
    return run
