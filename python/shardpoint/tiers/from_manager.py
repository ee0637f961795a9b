"""``sp.CheckpointManager(checkpoint, directory, ..., local_directory=...)``: the tiered manager
behind DESIGN.md §4's tier arguments of ``CheckpointManager``.

``shardpoint.objgraph`` cannot import this package (it sits below it), so this module registers
:func:`from_checkpoint_manager_arguments` with ``objgraph.manager_tiers`` when the package is
imported, and ``CheckpointManager.__new__`` calls it when a tier argument is given. The call is
checked against ``CheckpointManager``'s own signature, so a new argument of that class is
refused here until the tiers support it, never silently ignored.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import InvalidArgumentError
from ..objgraph.manager import CheckpointManager
from ..objgraph.manager_tiers import TIER_ARGUMENTS, register_tiered_factory
from .manager import TieredCheckpointManager

__all__ = ["from_checkpoint_manager_arguments", "register"]

#: ``CheckpointManager`` arguments that mean the same for the tiered manager
_CARRIED = ("max_to_keep", "init_fn")


def from_checkpoint_manager_arguments(*args: Any, **kwargs: Any) -> TieredCheckpointManager:
    """A :class:`TieredCheckpointManager` for ``CheckpointManager(*args, **kwargs)`` with tier
    arguments: ``checkpoint``, ``directory`` (the persistent tier), ``max_to_keep`` and
    ``init_fn`` as ``CheckpointManager`` takes them (positionally too), the tier arguments as
    keywords. Any other ``CheckpointManager`` argument given a value other than its default
    raises :class:`InvalidArgumentError` naming it."""
    tiers = {k: kwargs.pop(k) for k in list(kwargs) if k in TIER_ARGUMENTS}
    if "local_directory" not in tiers:
        raise InvalidArgumentError(
            f"CheckpointManager: {sorted(tiers)} need local_directory= (the node-local tier)"
        )
    signature = inspect.signature(CheckpointManager.__init__)
    try:
        bound = signature.bind(None, *args, **kwargs)  # None stands for self
    except TypeError as e:
        raise InvalidArgumentError(f"CheckpointManager: {e}") from None
    refused = [
        name
        for name, value in bound.arguments.items()
        if name not in ("self", "checkpoint", "directory", *_CARRIED)
        and not _is_default(value, signature.parameters[name].default)
    ]
    if refused:
        raise InvalidArgumentError(
            f"CheckpointManager with local_directory= (a tiered manager) does not take "
            f"{', '.join(refused)}; it takes max_to_keep, init_fn and the tier arguments "
            f"({', '.join(sorted(TIER_ARGUMENTS))}): docs/TIERS.md"
        )
    carried = {k: bound.arguments[k] for k in _CARRIED if k in bound.arguments}
    return TieredCheckpointManager(
        bound.arguments["checkpoint"], bound.arguments["directory"], **carried, **tiers
    )


def _is_default(value: Any, default: Any) -> bool:
    # equality only for plain values: a Variable passed as step_counter compares elementwise
    if value is default:
        return True
    plain = (str, int, float, bool)
    return isinstance(value, plain) and type(value) is type(default) and value == default


def register() -> None:
    """Make ``CheckpointManager(..., local_directory=...)`` build a tiered manager."""
    register_tiered_factory(from_checkpoint_manager_arguments)
