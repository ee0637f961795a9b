"""``lightning_run``'s module on 2 CPU processes (``strategy="ddp"``, gloo) with the tiers
switched on by ``ShardpointTiers`` and no other checkpointing:

    python -m integration_helpers.lightning_tiers_ddp ROOT EPOCHS [none]

Rank r's local tier is ``ROOT/node-r`` (one host, so each rank is a node of its own and keeps
the other's replica), the persistent tier ``ROOT/bucket``; a local save every epoch (2 steps:
each rank gets half of the 4 batches), a persistent one every 2. ``none``: no tiers (the uninterrupted run). Rank 0 prints one JSON
line: the final parameters' digest, the global step, the step restored and each rank's tier.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any


def main(argv: list[str]) -> None:
    import lightning.pytorch as pl

    from integration_helpers import lightning_run
    from integration_helpers.common import digest
    from shardpoint.integrations.lightning import ShardpointTiers

    root, epochs = argv[0], int(argv[1])
    # Lightning re-runs this command for rank 1 with LOCAL_RANK set; rank 0 has none yet
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    tiers = None
    if "none" not in argv[2:]:
        tiers = ShardpointTiers(
            os.path.join(root, "bucket"),
            local_directory=os.path.join(root, f"node-{rank}"),
            local_every=2,
            persistent_every=4,
        )
    model = lightning_run.make_module()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[tiers] if tiers is not None else [],
        default_root_dir=root,
        deterministic=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, lightning_run.loader())
    plan: Any = tiers.restore_plan if tiers is not None else None
    if trainer.global_rank == 0:
        out = {
            "digest": digest(model.state_dict()),
            "global_step": trainer.global_step,
            "restored": tiers.restored_step if tiers is not None else None,
            "tiers": None if plan is None or plan.step is None else [s.tier for s in plan.sources],
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    from integration_helpers.common import exit_rank

    exit_rank()  # both ranks: the DDP model keeps the gloo group alive (exit_rank)
