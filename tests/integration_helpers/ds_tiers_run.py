"""One rank of a 2-rank DeepSpeed ZeRO-2 job on the CPU (gloo) keeping its checkpoints in the
tiers (``use_shardpoint(engine, local_directory=...)``). Each rank is its own node
(``ROOT/<case>/node-<rank>``), so each keeps a replica of the other's part; the persistent
tier is ``ROOT/<case>/bucket`` (the ``save_checkpoint`` directory).

    python -m integration_helpers.ds_tiers_run RANK PORT ROOT ACTION [CASE...]

``SP_TEST_ZERO_STAGE`` (default 2) sets the ZeRO stage, ``SP_TEST_ZERO_ELASTIC=1`` DeepSpeed's
``elastic_checkpoint`` (every rank then reads every rank's optimizer partition). ACTION ``first``: in ``ROOT/a``, ``load_checkpoint`` (nothing there: a fresh start), then 8
steps with ``save_checkpoint`` after steps 2, 4 and 6 (persistent every 4). ``resume``: for
each CASE, a new engine restores in ``ROOT/<CASE>`` and trains to step 8. Writes
``ROOT/out-<RANK>.json``: per run the restored step, each rank's tier, the loss (hex) and a
digest of the parameters and this rank's optimizer partition after every step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch

STEPS = 8


def _engine(root: str, rank: int) -> Any:
    import deepspeed

    from shardpoint.integrations.deepspeed import use_shardpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    cfg = {
        "train_batch_size": 8,
        "zero_optimization": {
            "stage": int(os.environ.get("SP_TEST_ZERO_STAGE", "2")),
            "elastic_checkpoint": os.environ.get("SP_TEST_ZERO_ELASTIC") == "1",
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return use_shardpoint(
        eng,
        local_directory=os.path.join(root, f"node-{rank}"),
        tiers={"persistent_every": 4, "replicas": 1},
    )


def _step(eng: Any, step: int, rank: int) -> tuple[str, str]:
    g = torch.Generator().manual_seed(100 + step + 1000 * rank)
    x = torch.randn(4, 8, generator=g)
    loss = torch.nn.functional.mse_loss(eng(x), x.sum(1, keepdim=True).sin())
    eng.backward(loss)
    eng.step()
    h = hashlib.sha256()
    opt = getattr(eng.optimizer, "optimizer", eng.optimizer)  # ZeRO wraps the AdamW
    moments = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    partitions = list(getattr(eng.optimizer, "single_partition_of_fp32_groups", []))
    partitions += list(getattr(eng.optimizer, "fp32_partitioned_groups_flat", []))  # ZeRO-3
    for t in [*eng.module.parameters(), *partitions, *moments]:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return loss.item().hex(), h.hexdigest()


def _refusals(eng: Any, bucket: str) -> dict[str, str]:
    """The messages of what the tiers refuse (each raised before any collective)."""
    from shardpoint.integrations.deepspeed import use_shardpoint

    out = {}
    calls = {
        "tag": lambda: eng.load_checkpoint(bucket, tag="global_step2"),
        "local_every": lambda: use_shardpoint(
            eng, local_directory=bucket, tiers={"local_every": 2}
        ),
        "no_local": lambda: use_shardpoint(eng, tiers={"replicas": 1}),
        "outside_load": lambda: eng.checkpoint_engine.load(os.path.join(bucket, "x")),
    }
    for name, call in calls.items():
        try:
            call()
        except Exception as e:  # reported to the test, which checks type and message
            out[name] = f"{type(e).__name__}: {e}"
    return out


def main(rank: int, port: int, root: str, action: str, cases: list[str]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
    )
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    runs: list[dict[str, Any]] = []
    for case in ["a"] if action == "first" else cases:
        where = os.path.join(root, case)
        bucket = os.path.join(where, "bucket")
        eng = _engine(where, rank)
        refused = _refusals(eng, bucket) if action == "first" else {}
        load_path, _ = eng.load_checkpoint(bucket)
        tiers = eng.checkpoint_engine
        start = int(eng.global_steps)
        plan = tiers.restore_plan
        steps = []
        for step in range(start, STEPS):
            steps.append(_step(eng, step, rank))
            if action == "first" and (step + 1) % 2 == 0 and step + 1 < STEPS:
                eng.save_checkpoint(bucket)
        tiers.close()
        runs.append(
            {
                "loaded": load_path is not None,
                "restored": tiers.restored_step,
                "start": start,
                "tiers": [s.tier for s in plan.sources] if plan is not None else None,
                "fetched": tiers.fetched_from,
                "refused": refused,
                "steps": steps,
            }
        )
    with open(os.path.join(root, f"out-{rank}.json"), "w") as f:
        json.dump(runs, f)
    import torch.distributed as dist

    dist.barrier()
    from integration_helpers.common import exit_rank

    exit_rank()  # the engine keeps the gloo group alive into finalization (exit_rank)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
