"""A tiny DeepSpeed ZeRO training run on the CPU (gloo), as a child process per rank:

    python -m integration_helpers.ds_run JOB [; JOB ...]

JOB is ``train KIND DIR STEPS STAGE`` (checkpoint every 3 steps), ``resume KIND DIR STEPS
STAGE TAG`` (TAG ``latest`` reads DeepSpeed's ``latest`` file) or ``load KIND DIR STAGE TAG``
(only load: reports the error, if any). KIND is ``shardpoint``, ``shardpoint-async``
(``blocking=False``: DeepSpeed's decoupled commit) or ``native``. Prints one JSON
line: per job, the losses (hex floats) and a digest of the final parameters, or the error.
One rank unless the parent sets ``RANK``/``WORLD_SIZE``/``MASTER_PORT`` (each rank then feeds
its own micro-batches; the global batch is 4 per rank).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from integration_helpers.common import arm_kill_hook, digest, exit_rank, hexes

SAVE_EVERY = 3


def _init() -> Any:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # one rank alone (no parent set a rendezvous): its store binds any free port itself; a
    # port derived from the pid was shared by two such runs at once (test_resume_in_place
    # beside the serial group's DeepSpeed tests) whenever their pids agreed modulo 1000
    os.environ.setdefault("MASTER_PORT", "0")
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def engine(kind: str, stage: int) -> Any:
    deepspeed = _init()
    from shardpoint.integrations.deepspeed import use_shardpoint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    cfg = {
        "train_batch_size": 4 * int(os.environ["WORLD_SIZE"]),
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg)
    if kind.startswith("shardpoint"):
        use_shardpoint(eng, blocking=kind != "shardpoint-async")
    return eng


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step + 1000 * int(os.environ.get("RANK", "0")))
    x = torch.randn(4, 8, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def run(eng: Any, directory: str, start: int, steps: int) -> dict[str, Any]:
    losses = []
    for step in range(start, steps):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(eng(x), y)
        eng.backward(loss)
        eng.step()
        losses.append(loss.item())
        if (step + 1) % SAVE_EVERY == 0:
            eng.save_checkpoint(directory)
    import deepspeed

    # under ZeRO-3 the module's parameters are partitioned placeholders: gather them first
    with deepspeed.zero.GatheredParameters(list(eng.module.parameters())):
        params = {n: p.detach().clone() for n, p in eng.module.named_parameters()}
    return {"losses": hexes(losses), "digest": digest(params)}


def in_place(kind: str, directory: str, stage: int) -> dict[str, Any]:
    """Train one step, save, build a new engine and load the checkpoint into it: whether the
    module's parameters and the ZeRO optimizer's fp32 partitions are the same tensors after
    the load, hold the saved bytes, and whether any parameter was copied from other memory."""
    from integration_helpers.common import ParameterCopies, bits

    eng = engine(kind, stage)
    run(eng, directory, 0, 1)
    eng.save_checkpoint(directory, tag="one")
    saved = {k: bits(v) for k, v in eng.module.state_dict().items()}
    saved_parts = [bits(t) for t in eng.optimizer.single_partition_of_fp32_groups]
    fresh = engine(kind, stage)
    before = {k: v.data_ptr() for k, v in fresh.module.state_dict().items()}
    parts = fresh.optimizer.single_partition_of_fp32_groups
    parts_before = [t.data_ptr() for t in parts]
    with ParameterCopies(fresh.module.parameters()) as spy:
        fresh.load_checkpoint(directory, tag="one")
    after = fresh.module.state_dict()
    return {
        "same_tensors": {k: v.data_ptr() for k, v in after.items()} == before,
        "same_bytes": {k: bits(v) for k, v in after.items()} == saved,
        "same_partitions": [t.data_ptr() for t in parts] == parts_before
        and parts is fresh.optimizer.single_partition_of_fp32_groups,
        "partitions_saved_bytes": [bits(t) for t in parts] == saved_parts,
        "copies_into_params": spy.into_params,
        "from_elsewhere": len(spy.from_elsewhere),
    }


def job(args: list[str]) -> dict[str, Any]:
    what, kind, directory = args[0], args[1], args[2]
    if what == "train":
        return run(engine(kind, int(args[4])), directory, 0, int(args[3]))
    if what == "resume":
        eng = engine(kind, int(args[4]))
        tag = None if args[5] == "latest" else args[5]
        _, client = eng.load_checkpoint(directory, tag)
        return run(eng, directory + "-resumed", eng.global_steps, int(args[3]))
    if what == "inplace":
        return in_place(kind, directory, int(args[3]))
    eng = engine(kind, int(args[3]))
    try:
        eng.load_checkpoint(directory, args[4])
    except Exception as e:  # reported to the parent, which checks type and message
        return {
            "error": type(e).__name__,
            "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e),
        }
    return {"error": None}


def main(argv: list[str]) -> None:
    arm_kill_hook()
    results = []
    current: list[str] = []
    for arg in [*argv, ";"]:
        if arg != ";":
            current.append(arg)
            continue
        results.append(job(current))
        current = []
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    # Not left to the interpreter's exit: gloo's threads were destroyed there still joinable
    # under load ("terminate called without an active exception", SIGABRT after the results
    # were printed), and destroying the group first is not enough (the engine keeps it).
    exit_rank()
