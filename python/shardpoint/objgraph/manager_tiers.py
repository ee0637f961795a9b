"""The tier arguments of :class:`~shardpoint.objgraph.manager.CheckpointManager`
(``local_directory=..., local_every=..., persistent_every=..., replicas=...``, DESIGN.md §4).

The tiers (``shardpoint.tiers``) sit above this package and use it, so this package must not
import them. Instead ``shardpoint.tiers`` registers a factory here when it is imported
(``import shardpoint`` does that), and ``CheckpointManager(...)`` called with any tier argument
hands its arguments to that factory, which returns a ``TieredCheckpointManager``. Without tier
arguments nothing here is involved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["TIER_ARGUMENTS", "register_tiered_factory", "tiered_manager"]

#: keyword arguments that make ``CheckpointManager(...)`` a tiered manager (docs/TIERS.md)
TIER_ARGUMENTS = frozenset(
    {
        "local_directory",
        "local_every",
        "persistent_every",
        "replicas",
        "replication_jump",
        "local_max_to_keep",
        "process_group",
        "timeout",
    }
)

_factory: Callable[..., Any] | None = None


def register_tiered_factory(factory: Callable[..., Any]) -> None:
    """Make ``factory(*args, **kwargs)`` build what ``CheckpointManager(*args, **kwargs)``
    returns when tier arguments are given (``shardpoint.tiers`` calls this on import)."""
    global _factory
    _factory = factory


def tiered_manager(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The tiered manager for ``CheckpointManager(*args, **kwargs)``."""
    if _factory is None:
        raise InvalidArgumentError(
            f"CheckpointManager: the tier arguments {sorted(TIER_ARGUMENTS & set(kwargs))} need "
            "the tiers package; import shardpoint.tiers (import shardpoint does)"
        )
    return _factory(*args, **kwargs)
