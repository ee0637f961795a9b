"""One rank of a 2-rank gloo job (DDP, AdamW) of a DCP user: the state dict handed to
``dcp.save`` (an ``AppState`` Stateful over ``get_state_dict``/``set_state_dict``) saved by the
tiered manager through ``sptorch.StateDictCheckpoint``. Each rank is its own node
(``ROOT/<case>/node-<rank>``), so each keeps a replica of the other's part.

    python -m tiers_helpers.dcp_job RANK PORT ROOT ACTION [CASE...]

ACTION ``first``: train 10 steps without the manager (the uninterrupted run), then from
scratch 7 steps with it in ``ROOT/a`` (local every 2, persistent every 4). ``resume``: for each
CASE, restore in ``ROOT/<CASE>`` and train to step 10. Writes ``ROOT/out-<RANK>.json``: per run
the restored step, each rank's tier and a digest after every step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

import shardpoint as sp
import shardpoint.torch as sptorch

STEPS = 10


class AppState:
    """The Stateful of the DCP tutorial: model and optimizer through get/set_state_dict."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


def _build() -> tuple[Any, Any]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = DistributedDataParallel(net)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _step(model: Any, opt: Any, step: int, rank: int) -> str:
    g = torch.Generator().manual_seed(step * 10 + rank)
    x = torch.randn(4, 8, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())
    opt.zero_grad()
    loss.backward()
    opt.step()
    h = hashlib.sha256()
    for t in [*model.state_dict().values(), *_moments(opt)]:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _moments(opt: Any) -> list[torch.Tensor]:
    return [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


def _manager(root: str, rank: int, model: Any, opt: Any) -> Any:
    return sp.CheckpointManager(
        sptorch.StateDictCheckpoint({"app": AppState(model, opt)}),
        os.path.join(root, "bucket"),
        local_directory=os.path.join(root, f"node-{rank}"),
        local_every=2,
        persistent_every=4,
    )


def main(rank: int, port: int, root: str, action: str, cases: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    runs: list[dict[str, Any]] = []
    if action == "first":
        model, opt = _build()
        runs.append({"digests": [_step(model, opt, s, rank) for s in range(1, STEPS + 1)]})
        model, opt = _build()
        manager = _manager(os.path.join(root, "a"), rank, model, opt)
        assert manager.restore_or_initialize() is None
        digests = []
        for step in range(1, 8):
            digests.append(_step(model, opt, step, rank))
            manager.save(step)
        manager.close()
        runs.append({"digests": digests})
    else:
        for case in cases:
            model, opt = _build()
            manager = _manager(os.path.join(root, case), rank, model, opt)
            start = manager.restore_or_initialize()
            plan = manager.restore_plan()
            digests = [_step(model, opt, s, rank) for s in range(start + 1, STEPS + 1)]
            manager.close()
            runs.append(
                {"start": start, "tiers": [s.tier for s in plan.sources], "digests": digests}
            )
    with open(os.path.join(root, f"out-{rank}.json"), "w") as f:
        json.dump(runs, f)
    dist.barrier()
    from integration_helpers.common import exit_rank

    exit_rank()  # the DDP model keeps the gloo group alive into finalization (exit_rank)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
