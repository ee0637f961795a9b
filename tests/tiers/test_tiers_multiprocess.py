"""4 real ranks (gloo processes) as 2 nodes (2 local directories): peer replicas, a wiped
node, a corrupted replica, ranks killed by SIGKILL at every named fault point, the persistent
tier on a directory and on the S3 server behind a real proxy. Every restore must be exact
(values saved at the restored step, on every rank) and the same step on every rank.

The base job (steps 10 and 20 in the local tier, 20 also persistent) runs once; each test
works on a copy of its directories. Ranks are forked from one server that imported torch
once (tiers_helpers.job), so a job costs about a second, not tens.
"""

from __future__ import annotations

import os
import shutil

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from shardpoint.tiers import FAULT_POINTS  # noqa: E402
from tiers_helpers.job import WORLD, run_job  # noqa: E402

CFG = {"local_every": 10, "persistent_every": 20, "replicas": 1, "n": 20000}


def _cfg(tmp, **kw):
    return {**CFG, "persistent": os.path.join(tmp, "persist"), **kw}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("tiers-base"))
    codes, outs = run_job(tmp, [["save", [10, 20]]], _cfg(tmp))
    assert codes == [0] * WORLD, [o.get("error") for o in outs]
    return tmp


@pytest.fixture
def job(base, tmp_path):
    tmp = str(tmp_path / "job")
    shutil.copytree(base, tmp)
    return tmp


def _restore(tmp, **kw):
    codes, outs = run_job(tmp, [["restore"]], _cfg(tmp, **kw))
    assert codes == [0] * WORLD, [o.get("error") for o in outs]
    events = [o["events"][-1] for o in outs]
    steps = {e[1] for e in events}
    assert len(steps) == 1, f"ranks restored different steps: {events}"
    assert all(e[2] for e in events), f"a restore was not exact: {events}"
    return events[0][1], events[0][4], events[0][5]


def test_wiped_node_gets_its_parts_from_peers(job):
    shutil.rmtree(os.path.join(job, "node-1"))
    step, tiers, excluded = _restore(job)
    assert step == 20 and tiers == ["local", "local", "peer", "peer"] and excluded == []
    # the wiped node's local tier was refilled: a second restore is all local
    assert _restore(job)[1] == ["local"] * WORLD


def test_corrupted_replica_is_refused_and_the_next_copy_used(job):
    shutil.rmtree(os.path.join(job, "node-1"))
    # rank 0 holds rank 2's replica (rank + 2): damage one byte of its data shard
    d = os.path.join(job, "node-0", "rank-00000", "replica-00002")
    shard = next(n for n in os.listdir(d) if n.startswith("ckpt-20.data-"))
    path = os.path.join(d, shard)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 3] ^= 0x01
    open(path, "wb").write(bytes(data))
    step, tiers, excluded = _restore(job)
    assert step == 20 and tiers == ["local", "local", "persistent", "peer"]
    assert len(excluded) == 1 and "ChecksumMismatch" in excluded[0]


def test_both_nodes_wiped_restores_from_the_persistent_tier(job):
    for n in (0, 1):
        shutil.rmtree(os.path.join(job, f"node-{n}"))
    step, tiers, _ = _restore(job)
    assert step == 20 and tiers == ["persistent"] * WORLD


# (point, rank killed, steps saved by the killed job, nodes wiped before the restore,
#  expected step): a kill before every rank agreed leaves the step uncommitted everywhere
KILLS = {
    "local:after-part": (2, [30], [], 20),
    "replicate:after-send": (1, [30], [], 20),
    "replicate:after-receive": (3, [30], [], 20),
    # after the agreement every part and replica is durable: the dead rank's part is found
    # in its peer's replica even though the dead rank wrote no record for its own
    "commit:after-agree": (2, [30], [], 30),
    "commit:between-markers": (2, [30], [], 30),
    # the persistent upload of 40 dies: 40 is complete locally but not persistently; with
    # every local tier wiped, the restore must come from the persistent 20
    "persistent:after-data": (2, [30, 40], [0, 1], 20),
    "persistent:after-part": (1, [30, 40], [0, 1], 20),
    "persistent:before-commit": (0, [30, 40], [0, 1], 20),
}
FAST = {"local:after-part", "commit:after-agree", "persistent:after-data"}
assert set(KILLS) == set(FAULT_POINTS)


@pytest.mark.parametrize(
    "point",
    [p if p in FAST else pytest.param(p, marks=pytest.mark.slow) for p in FAULT_POINTS],
)
def test_kill_at_every_point_restores_the_newest_really_complete_step(job, point):
    rank, steps, wipe, expected = KILLS[point]
    fault = f"{point}@{rank}#{steps[-1] if point.startswith('persistent') else 30}"
    codes, _ = run_job(job, [["save", steps]], _cfg(job, fault=fault), timeout=60)
    assert codes[rank] == -9  # died by the signal, at the point
    for n in wipe:
        shutil.rmtree(os.path.join(job, f"node-{n}"))
    step, tiers, _ = _restore(job)
    assert step == expected, tiers
    # and the job goes on: a new save of the step numbers the dead job used, then a restore
    codes, outs = run_job(job, [["save", [30, 40]], ["restore"]], _cfg(job))
    assert codes == [0] * WORLD, [o.get("error") for o in outs]
    assert {o["events"][-1][1] for o in outs} == {40} and all(o["events"][-1][2] for o in outs)


def test_persistent_tier_on_s3_behind_a_rate_limited_proxy(tmp_path):
    pytest.importorskip("moto.server")
    from s3_server import Proxy, moto_environment

    tmp = str(tmp_path)
    with moto_environment() as moto:
        proxy = Proxy(moto.port, rate_bytes_per_s=50e6)
        try:
            env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
            env["AWS_ENDPOINT_URL"] = proxy.endpoint
            url = f"s3://{moto.bucket()}/job"
            cfg = _cfg(tmp, persistent=url, env=env)
            codes, outs = run_job(tmp, [["save", [10, 20]]], cfg)
            assert codes == [0] * WORLD, [o.get("error") for o in outs]
            for n in (0, 1):
                shutil.rmtree(os.path.join(tmp, f"node-{n}"))
            codes, outs = run_job(tmp, [["restore"]], cfg)
            assert codes == [0] * WORLD, [o.get("error") for o in outs]
            events = [o["events"][-1] for o in outs]
            assert all(e[1] == 20 and e[2] and e[4] == ["persistent"] * WORLD for e in events)
            assert proxy.requests("PUT") and proxy.requests("GET")
        finally:
            proxy.close()
