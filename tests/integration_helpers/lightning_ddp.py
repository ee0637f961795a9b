"""The run of ``lightning_run`` on 2 CPU processes (gloo), with ShardpointCheckpointIO:

    python -m integration_helpers.lightning_ddp STRATEGY ROOT EPOCHS [RESUME]

STRATEGY is ``ddp`` (Lightning re-runs this command for rank 1) or ``ddp_spawn`` (workers
spawned from this process; the plugin is pickled to them). The launching process prints one
JSON line: the digest of the final parameters (``ddp_spawn`` hands them back to it through
the plugin, as Lightning does) and the global step.

``SP_TEST_KILL_AT_SAVE=n``: during rank 0's n-th shardpoint save (data being written, not yet
committed) the whole process group is SIGKILLed, as a preempted job is; run it in a session
of its own.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from typing import Any


def arm_group_kill() -> None:
    """Armed at import, so the spawned workers of ``ddp_spawn`` (which import this module as
    their ``__mp_main__``) carry it too. Test-only monkeypatching, as ``arm_kill_hook``."""
    at = int(os.environ.get("SP_TEST_KILL_AT_SAVE", "0"))
    if not at:
        return
    from shardpoint.storage import save as files

    count = {"saves": 0}

    class KillBar:
        def __init__(self, total: float | None, desc: str, **_: Any) -> None:
            count["saves"] += 1
            self.armed = count["saves"] == at

        def update(self, n: float) -> None:
            if self.armed:
                print("SELFKILL mid-save", flush=True)
                os.killpg(os.getpgid(0), signal.SIGKILL)

        def close(self) -> None:
            pass

    files.wanted = lambda progress: True  # type: ignore[assignment]
    files.progress_bar = KillBar  # type: ignore[assignment]


arm_group_kill()


def main(argv: list[str]) -> None:
    from integration_helpers import lightning_run

    strategy, root, epochs = argv[0], argv[1], int(argv[2])
    resume = argv[3] if len(argv) > 3 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = lightning_run.train(
            "shardpoint",
            root,
            epochs,
            resume,
            strategy=lightning_run.SpawnStrategy() if strategy == "ddp_spawn" else strategy,
            devices=2,
        )
    if out["rank"] == 0:
        print(json.dumps({"digest": out["digest"], "global_step": out["global_step"]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    # every rank (rank 1 of ``ddp`` runs this command too); ddp_spawn's workers end in
    # lightning_run.ExitingLauncher: the DDP model keeps the gloo group alive (exit_rank)
    from integration_helpers.common import exit_rank

    exit_rank()
