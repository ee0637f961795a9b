"""A rank of tests/scale/test_shared_listings.py: a real gloo process that builds a
``CheckpointManager`` on an S3 URL, restores, and asks ``sp.latest_checkpoint``: first on its
own, then with ``shardpoint.torch.share_listings`` (argv: rank world init_file url). Between
the two, after a barrier, rank 0 reads the object ``<url>/phase-marker`` (absent), so that the
test can split the requests it counted. Prints one JSON line per phase: the restored path, the
latest checkpoint and the restored values."""

from __future__ import annotations

import contextlib
import json
import sys

import numpy as np
import torch.distributed as dist

import shardpoint as sp
import shardpoint.torch as spt
from shardpoint.errors import NotFoundError


def _restore(url: str) -> dict:
    ckpt = sp.Checkpoint(v=sp.Variable(np.zeros(3, np.float32)))
    manager = sp.CheckpointManager(ckpt, url, max_to_keep=3)
    path = manager.restore_or_initialize()
    latest = sp.latest_checkpoint(url)
    return {"path": path, "latest": latest, "v": ckpt.v.numpy().tolist()}


def main() -> None:
    rank, world, init, url = sys.argv[1:5]
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=int(rank), world_size=int(world)
    )
    try:
        print(json.dumps(_restore(url)), flush=True)
        dist.barrier()
        if rank == "0":
            with contextlib.suppress(NotFoundError):
                sp.storage.read_object(f"{url}/phase-marker")
        dist.barrier()
        with spt.share_listings():
            print(json.dumps(_restore(url)), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
