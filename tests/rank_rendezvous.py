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
from collections.abc import Iterator


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
