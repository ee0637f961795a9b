"""Named fault-injection points of the tiered manager (test and drill use only).

``SHARDPOINT_TIERS_FAULT=<point>[@<rank>][#<step>]`` makes the process that reaches ``<point>``
(on rank ``<rank>``, saving step ``<step>``, when given) kill itself with SIGKILL there: no
``finally`` block, no atexit handler, exactly like a node that loses power. The points are the
moments between the durable effects of a save (docs/TIERS.md, "Fault points"); a test kills a
rank at each and checks that the restore is still exact. Unset (the default), every check is
one environment lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "FAULT_POINTS", "fault_point"]

#: the environment variable naming the point to die at
FAULT_ENV = "SHARDPOINT_TIERS_FAULT"

#: every point, in the order a save reaches them
FAULT_POINTS = (
    "local:after-part",  # own part committed in the local tier; nothing sent yet
    "replicate:after-send",  # own part handed to the peers; replicas not yet received
    "replicate:after-receive",  # replicas held here are durable; no agreement yet
    "commit:after-agree",  # every rank said "durable"; no commit marker written yet
    "commit:between-markers",  # own part's marker written; the replicas' not yet
    "persistent:after-data",  # data shards uploaded, the part's index not yet
    "persistent:after-part",  # the whole part uploaded; no agreement yet
    "persistent:before-commit",  # every part uploaded and agreed; commit record not yet written
)


def fault_point(name: str, rank: int, step: int) -> None:
    """Die by SIGKILL if ``SHARDPOINT_TIERS_FAULT`` names this point (and rank, step)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, _, rest = spec.partition("@")
    want_rank, _, want_step = rest.partition("#")
    if "#" in point:  # "<point>#<step>" without a rank
        point, _, want_step = point.partition("#")
    if point != name:
        return
    if want_rank and int(want_rank) != rank:
        return
    if want_step and int(want_step) != step:
        return
    os.kill(os.getpid(), signal.SIGKILL)
