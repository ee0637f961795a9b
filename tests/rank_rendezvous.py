"""The rendezvous of a test's gloo ranks, served by the test process on a port it holds.

Why not a port picked free and handed to rank 0 to bind: between the pick and rank 0's bind
(seconds while a spawned rank imports torch on a loaded machine) the port is free for anyone,
and the other xdist worker binds and connects all the time (moto servers, proxies, its own
jobs): a rank 0 that lost the port fails the test with "address already in use". Here the
test process binds port 0 and keeps the store; every rank is a client of it, which is how
torch's elastic agent serves its ranks (``TORCHELASTIC_USE_AGENT_STORE``: env:// rendezvous
then makes no rank a server, whatever launcher or trainer calls ``init_process_group``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def rendezvous_env() -> Iterator[dict[str, str]]:
    """Serve a store for one job while the block runs; yields the environment of its ranks
    (``MASTER_ADDR``, ``MASTER_PORT`` and the agent-store switch)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        yield {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    finally:
        del store


def run_rank_modules(
    module: str, root: Path, args: Sequence[str], *, timeout: float, world: int = 2
) -> list[Any]:
    """Run ``python -m module RANK PORT ROOT *args`` for every rank (the ``tests`` folder on
    their path, this process serving their store) and return each rank's ``out-RANK.json``
    from ``root``; a rank that fails fails the test with the tail of every rank's stderr."""
    tests = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tests), *filter(None, [env.get("PYTHONPATH")])])
    # DeepSpeed's CPU communication op is built with the environment's ninja
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    with rendezvous_env() as rendezvous:  # the ranks' store, served here
        env.update(rendezvous)
        cmd = [sys.executable, "-m", module]
        port = rendezvous["MASTER_PORT"]
        procs = [
            subprocess.Popen(
                [*cmd, str(r), port, str(root), *args], env=env, stderr=subprocess.PIPE
            )
            for r in range(world)
        ]
        errors = [p.communicate(timeout=timeout)[1].decode(errors="replace")[-3000:] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, errors
    return [json.loads((root / f"out-{r}.json").read_text()) for r in range(world)]
