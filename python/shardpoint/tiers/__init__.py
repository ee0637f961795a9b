"""Multi-tier checkpoints: a node-local tier every few steps, replicas of each rank's part on
other nodes, and a persistent tier (a path or an object store) every many steps, written in
the background from the local copy; restore takes every rank's part from the cheapest tier
holding the newest step complete for all ranks. Over the job's own ``torch.distributed``
group (gloo subgroups of it), never a service of its own. See docs/TIERS.md.
"""

from __future__ import annotations

from .faults import FAULT_ENV, FAULT_POINTS
from .from_manager import register as _register
from .manager import TieredCheckpointManager
from .plan import PartSource, RestorePlan

_register()  # sp.CheckpointManager(..., local_directory=...) builds a TieredCheckpointManager

__all__ = ["TieredCheckpointManager", "RestorePlan", "PartSource", "FAULT_ENV", "FAULT_POINTS"]
