"""Thousands of ranks on one machine (docs/SCALE.md): N simulated ranks (threads, tiny payloads)
save one checkpoint through the code a real rank calls, and the coordinator's side is measured.
The harness itself is tests/scale_harness.py (the tests run it at N = 64).

    python benches/bench_scale.py                        # local dir, writer + DCP, N = 512..4096
    python benches/bench_scale.py --store s3 --latency 0.02 --paths writer --ns 192 4096
    python benches/bench_scale.py --store s3 --paths dcp --ns 64 --load 8   # loads N -> 3N/4
    python benches/bench_scale.py --store s3 --paths dcp --ns 16 --load 4 --tensors 4 \
        --cols 65536 --no-dcp-default      # the same with ~1 MiB per loading rank and tensor

Reports per N: coordinator CPU (merge, and against a local directory the same writer save
again at its prefix, layout unchanged, ``writer2``; DCP: global plan + our
prepare_global_plan + finish; our planner: a first save ``ours``, an unchanged one ``ours2``
merged in the remembered order, and the same unchanged save with that order forgotten
``ours2h``, the heap merge),
the commit's wall time, bytes per rank to/from the coordinator (DCP's gathered/scattered plans
and results, pickled as DCP sends them), requests per rank and per commit by S3 operation
(``--store s3``: an S3 server in its own process, benches/s3server.py: ours, which adds the
``--latency`` seconds per request and counts requests itself; or moto, with ``--s3-server
moto`` or without cargo, behind the counting proxy of tests/s3_server.py run in a process of
its own), objects per rank. ``--dcp-max`` caps N for DCP's own planner (its global
step grows faster than linearly; see docs/SCALE.md).

``--hashed-prefixes``: the writer path's ranks save with ``hashed_prefixes=True`` (FORMAT.md
§3.1.1), and each writer row is followed by how the save's objects spread over key prefixes
(the object store's unit of request rate: S3 ~3,500 writes/s each): writes (objects listed
after the save plus the partial indexes the merge consumed), distinct prefixes, writes under
the busiest one. A prefix is ``P/HH/`` for a hashed shard or partial index, ``P.`` for
everything at the checkpoint's own prefix (plain shards and partial indexes, the index).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benches"))

import scale_harness as h  # noqa: E402
from shardpoint import _core  # noqa: E402


def _row(run: h.SaveRun) -> str:
    steps = " ".join(f"{k}={v:.3f}" for k, v in run.steps.items())
    return (
        f"{run.path:6s} N={run.n:5d} coord_cpu={run.coordinator_cpu_s:7.3f}s "
        f"commit_wall={run.commit_wall_s:7.3f}s save_wall={run.save_wall_s:7.2f}s "
        f"to_coord={run.bytes_to_coordinator:7.0f}B from_coord={run.bytes_from_coordinator:7.0f}B "
        f"objects/rank={run.objects_per_rank:.3f} rank_req={run.rank_requests} "
        f"commit_req={run.commit_requests} [{steps}]"
    )


def _prefix_spread(prefix: str, moto: object, partials: int, hashed: bool = False) -> str:
    """How the writes of a save at ``prefix`` spread over key prefixes (module docstring): one
    per object listed after the save (a shard under ``part_size`` is one PUT), plus the
    ``partials`` partial indexes that the merge consumed: at ``P.``, or with ``hashed`` at
    ``P/HH/`` (``HH`` from the rank, FORMAT.md §3.1.1)."""
    if prefix.startswith("s3://"):
        bucket, key = prefix[len("s3://") :].split("/", 1)
        keys = [k for k in moto.keys(bucket) if k.startswith(key)]  # type: ignore[attr-defined]
    else:
        key = prefix
        keys = [os.path.join(r, f) for r, _, fs in os.walk(os.path.dirname(prefix)) for f in fs]
        keys = [k for k in keys if k.startswith(prefix) and not k.endswith(".lock")]
    groups: dict[str, int] = {}
    for r in range(partials):
        plain = f".index.part-{r:05d}-of-{partials:05d}"
        g = f"/{_core.crc32c(plain.encode()) & 0xFF:02x}/" if hashed else "."
        groups[g] = groups.get(g, 0) + 1
    for k in keys:
        rest = k[len(key) :]
        g = rest[:4] if rest.startswith("/") else "."
        groups[g] = groups.get(g, 0) + 1
    busiest = max(groups.values(), default=0)
    total = len(keys) + partials
    return f"       writes={total} prefixes={len(groups)} busiest_prefix_writes={busiest}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--paths", nargs="+", default=["writer", "dcp"], choices=["writer", "dcp"])
    ap.add_argument("--store", choices=["local", "s3"], default="local")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added per S3 request")
    ap.add_argument("--tensors", type=int, default=100, help="tensors per rank")
    ap.add_argument("--dcp-max", type=int, default=4096, help="largest N for the DCP path")
    ap.add_argument(
        "--no-dcp-default",
        action="store_true",
        help="DCP path: only our planner (DCP's own takes minutes at 4,096)",
    )
    ap.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="K",
        help="DCP path: load the checkpoint of our planner into M = 3N/4 ranks with DCP's "
        "DefaultLoadPlanner and ours, K loading ranks measured (each alone)",
    )
    ap.add_argument(
        "--cols",
        type=int,
        default=4,
        help="float32 columns of every tensor (--load: rows are 3 per saving rank, 4 per "
        "loading rank, so a loading rank reads 16 x cols bytes of each tensor)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="DCP path: unchanged saves (ours2) per N; with more than one, their median and "
        "its growth from the smallest N to the largest are printed",
    )
    ap.add_argument("--json", help="write the runs here as JSON")
    ap.add_argument("--s3-server", default="auto", choices=["auto", "fast", "moto"])
    ap.add_argument(
        "--hashed-prefixes",
        action="store_true",
        help="writer path: shards under hashed key prefixes; report objects per prefix",
    )
    args = ap.parse_args()

    runs: list[h.SaveRun] = []
    unchanged: dict[int, float] = {}  # median ours2 coordinator CPU by N
    tmp = tempfile.mkdtemp(prefix="bench_scale-")
    moto = proxy = None
    opts = None
    env = None
    try:
        if args.store == "s3":
            from proxy_process import ProxyProcess
            from s3_server import opts_for
            from s3server import s3_environment

            env = s3_environment(args.s3_server)
            moto = env.__enter__()
            # ours delays and counts requests itself (thousands a second); before moto the
            # Python proxy, in its own process (in this one its threads took the GIL from the
            # merge and their CPU counted as the coordinator's)
            proxy = moto if moto.has_control else ProxyProcess(moto.port)
            opts = opts_for(proxy)
        for n in args.ns:
            for path in args.paths:
                if path == "dcp" and n > args.dcp_max:
                    continue
                if args.store == "s3":
                    assert moto is not None and proxy is not None
                    prefix = f"s3://{moto.bucket()}/{path}/ckpt"
                    proxy.latency = 0.0
                else:
                    d = os.path.join(tmp, f"{path}-{n}")
                    os.makedirs(d)
                    prefix = os.path.join(d, "ckpt")
                if proxy is not None:
                    # latency on the coordinator's commit only: N ranks' PUTs at 20 ms each
                    # through 8 threads would measure the harness, not the commit
                    proxy.latency = 0.0
                fn = h.writer_save if path == "writer" else h.dcp_save
                if path == "dcp" and args.no_dcp_default:
                    pass
                elif proxy is not None and args.latency:
                    run = _with_commit_latency(fn, prefix, n, args, proxy, moto, opts)
                    runs.append(run)
                    print(_row(run), flush=True)
                else:
                    kw = (
                        {"hashed_prefixes": True}
                        if path == "writer" and args.hashed_prefixes
                        else {}
                    )
                    run = fn(
                        prefix, n, tensors=args.tensors, proxy=proxy, moto=moto, options=opts, **kw
                    )
                    runs.append(run)
                    print(_row(run), flush=True)
                    if path == "writer":
                        hashed = bool(args.hashed_prefixes)
                        print(_prefix_spread(prefix, moto, n, hashed), flush=True)
                        if args.store == "local":
                            # the same save again at the same prefix, layout unchanged: the
                            # merge places the entries in the remembered order (writer2)
                            again = fn(prefix, n, tensors=args.tensors, options=opts, **kw)
                            again.path = "writer2"
                            print(
                                _row(again),
                                f"merge_order(in order, misfits)={_core.merge_order_stats()}",
                                flush=True,
                            )
                            runs.append(again)
                if path == "dcp":
                    # our planner beside DCP's, same run: a first save, then one whose
                    # layout did not change (every rank's plan cached)
                    kw = {"tensors": args.tensors, "proxy": proxy, "moto": moto, "options": opts}
                    if args.load:
                        kw["rows"] = 3  # 3N rows split evenly over M = 3N/4 loading ranks
                        kw["cols"] = args.cols
                    _core.forget_merge_orders()  # a first save: nothing remembered
                    first = h.dcp_save(prefix, n, planner="ours", **kw)
                    first.path = "ours"
                    print(_row(first), flush=True)
                    cpus = []
                    for _ in range(max(1, args.rounds)):
                        again = h.dcp_save(prefix, n, planner="ours", previous=first, **kw)
                        again.path = "ours2"
                        cpus.append(again.coordinator_cpu_s)
                        print(
                            _row(again),
                            f"merge_order(in order, misfits)={_core.merge_order_stats()}",
                            flush=True,
                        )
                    unchanged[n] = statistics.median(cpus)
                    if args.rounds > 1:
                        print(f"ours2  N={n:5d} median of {len(cpus)}: {unchanged[n]:.4f}s")
                    # the same unchanged save with the merge order forgotten: the heap merge
                    # (what every unchanged save did before the order was remembered)
                    _core.forget_merge_orders()
                    heap = h.dcp_save(prefix, n, planner="ours", previous=first, **kw)
                    heap.path = "ours2h"
                    print(_row(heap), flush=True)
                    first.final_plans = again.final_plans = heap.final_plans = []
                    runs += [first, again, heap]
                    if args.load:
                        _loads(prefix, n, args, proxy, opts)
                if args.store == "local":
                    shutil.rmtree(os.path.dirname(prefix))
    finally:
        if proxy is not None and proxy is not moto:
            proxy.close()
        if env is not None:
            env.__exit__(None, None, None)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.rounds > 1 and len(unchanged) > 1:
        lo, hi = min(unchanged), max(unchanged)
        print(f"ours2 growth {lo} -> {hi}: {unchanged[hi] / unchanged[lo]:.1f}x (medians)")
    if args.json:
        Path(args.json).write_text(
            json.dumps([{k: v for k, v in r.__dict__.items() if k != "final_plans"} for r in runs])
        )


def _loads(prefix: str, n: int, args: argparse.Namespace, proxy, opts) -> None:  # type: ignore[no-untyped-def]
    """The checkpoint just saved (ours, rows = 3) loaded into M = 3N/4 ranks, K of them
    measured, by DCP's planner and ours; one line each with the medians per loading rank."""

    m = 3 * n // 4
    ranks = sorted({round(i * (m - 1) / max(1, args.load - 1)) for i in range(args.load)})
    for planner in ("dcp", "ours"):
        for verify in (True, False) if proxy is not None else (True,):
            run = h.dcp_load(
                prefix,
                n,
                m,
                tensors=args.tensors,
                rows=3,
                cols=args.cols,
                planner=planner,
                ranks=ranks,
                verify=verify,
                proxy=proxy,
                options=opts,
                collect=True,
            )
            med = statistics.median
            amp = [d / w for d, w in zip(run.data_bytes, run.needed_bytes, strict=False)]
            print(
                f"load-{planner:4s} N={n} M={m} verify={verify!s:5s} "
                f"read_metadata_cpu={med(run.read_metadata_cpu_s):.3f}s "
                f"local_plan_cpu={med(run.plan_cpu_s):.4f}s "
                + (
                    f"open_req={run.open_requests[0]} open_bytes={med(run.open_bytes):.0f} "
                    f"data_req={run.data_requests[0]} data_bytes={med(run.data_bytes):.0f} "
                    f"needed={med(run.needed_bytes):.0f} amplification={med(amp):.3f} "
                    f"(max {max(amp):.3f})"
                    if proxy is not None
                    else ""
                ),
                flush=True,
            )


def _with_commit_latency(fn, prefix, n, args, proxy, moto, opts):  # type: ignore[no-untyped-def]
    """Run ``fn`` with ``args.latency`` added to the coordinator's requests only: the proxy's
    latency is switched on by the harness's reset before the commit."""
    orig_reset = proxy.reset
    calls = {"n": 0}

    def reset() -> None:
        orig_reset()
        calls["n"] += 1
        # writer_save resets before the ranks and before the merge; dcp_save the same
        proxy.latency = args.latency if calls["n"] >= 2 else 0.0

    proxy.reset = reset
    try:
        return fn(prefix, n, tensors=args.tensors, proxy=proxy, moto=moto, options=opts)
    finally:
        proxy.reset = orig_reset
        proxy.latency = 0.0


if __name__ == "__main__":
    main()
