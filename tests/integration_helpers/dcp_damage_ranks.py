"""Two gloo ranks meet a damaged shardpoint DCP checkpoint (a rank of its own per process):

    python -m integration_helpers.dcp_damage_ranks RANK PORT ROOT

The ranks save one checkpoint through ``shardpoint.torch.StorageWriter`` into ``ROOT/ck``
(a directory, as DCP's own writer is given), then for each damage — every ``.index`` gone, one
data shard cut to half, one data shard gone — rank 0 damages a copy, both ranks pass a barrier
and call ``dcp.load(checkpoint_id=copy)``. Each rank writes what it raised (class names and
message) to ``ROOT/out-RANK.json``. If one rank raised and the other went into DCP's
collectives, the run would hang there: the test's timeout is what catches that.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import shardpoint.torch as sptorch

DAMAGES = ("noindex", "trunc", "del")


def _damage(where: Path, how: str) -> str:
    """Damage ``where`` as ``how`` says; returns the file's name (the index or the shard)."""
    if how == "noindex":
        for f in where.glob("*.index"):
            f.unlink()
        return "checkpoint.index"
    shard = sorted(where.glob("checkpoint.data-*"))[-1]
    if how == "trunc":
        os.truncate(shard, shard.stat().st_size // 2)
    else:
        shard.unlink()
    return shard.name


def main(rank: int, root: Path) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    sd = {"w": torch.full((256, 64), float(rank + 1)), "b": torch.arange(16.0)}
    (root / "ck").mkdir(exist_ok=True)  # a directory: the checkpoint goes inside it
    dcp.save(sd, storage_writer=sptorch.StorageWriter(str(root / "ck")))
    out: dict[str, Any] = {}
    for how in DAMAGES:
        copy = root / how
        if rank == 0:
            shutil.copytree(root / "ck", copy)
            out[how + "-file"] = _damage(copy, how)
        dist.barrier()
        target = {"w": torch.zeros(256, 64), "b": torch.zeros(16)}
        try:
            dcp.load(target, checkpoint_id=str(copy))
            out[how] = {"loaded": True}
        except BaseException as e:  # DCP's own CheckpointException is a BaseException
            out[how] = {"mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}
        dist.barrier()
    dist.destroy_process_group()
    (root / f"out-{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[3]))
