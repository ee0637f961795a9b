"""What the trainer integrations hand the tiered manager: a rank's training state as a nested
tree (dicts/lists of tensors and plain values), captured by a function at each save and kept
in memory after a restore for the integration to apply.

:class:`shardpoint.TieredCheckpointManager` asks its ``checkpoint`` for ``write(prefix,
blocking=)`` and ``restore(prefix, verify=)``; each trainer knows what its state is (the HF
``Trainer``'s model, optimizer, scheduler, RNG and ``TrainerState``; accelerate's prepared
objects) and when it may be put back (the HF ``Trainer`` loads the optimizer only after it has
built it), so the tree is captured and applied by the integration, and only stored here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError
from ._state import load_tree, save_tree

__all__ = ["TreeState", "tier_options"]

#: the ``TieredCheckpointManager`` arguments an integration passes through (``directory``:
#: the persistent tier, defaulted by each integration)
TIER_OPTIONS = (
    "directory",
    "local_every",
    "persistent_every",
    "replicas",
    "replication_jump",
    "max_to_keep",
    "local_max_to_keep",
    "timeout",
    "compression",
)


def tier_options(owner: str, options: Any) -> dict[str, Any]:
    """``options`` (a mapping of ``TieredCheckpointManager`` arguments, or None) checked: an
    unknown name raises :class:`InvalidArgumentError` naming it and ``owner``."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidArgumentError(f"{owner}: the tier options must be a dict, got {options!r}")
    unknown = sorted(set(options) - set(TIER_OPTIONS))
    if unknown:
        raise InvalidArgumentError(
            f"{owner}: unknown tier options {unknown}; they are {list(TIER_OPTIONS)} "
            "(docs/TIERS.md)"
        )
    out = dict(options)
    if out.get("directory") is not None:
        out["directory"] = os.fspath(out["directory"])
    return out


class TreeState:
    """A checkpoint object for the tiered manager: ``capture()`` returns the tree a save
    stores; a restore keeps the tree read in :attr:`loaded` (tensors on the CPU)."""

    def __init__(self, capture: Callable[[], Any], integration: str) -> None:
        self._capture = capture
        self._integration = integration
        #: the tree of the last restore (None: none yet, or taken by the integration)
        self.loaded: dict[str, Any] | None = None

    def write(self, prefix: str, blocking: bool = True, compression: str | None = None) -> Any:
        # the manager's codec (default None: the local tier is read back on every restart
        # and sent to peers, and weights and optimizer moments barely compress)
        return save_tree(
            self._capture(),
            prefix,
            integration=self._integration,
            blocking=blocking,
            compression=compression,
        )

    def restore(self, prefix: str, verify: bool = True) -> None:
        from ..torch.tensors import _load

        if verify:
            self.loaded = dict(load_tree(prefix, integration=self._integration))
        else:  # the tiered manager checked every file's crc32c as it wrote it
            self.loaded = dict(_load(prefix, "cpu", None, False, False, None))


class TierRun:
    """A tiered manager over a :class:`TreeState`, opened on first use (a collective: every
    rank gets there together) for a trainer without a hook where training starts: accelerate's
    ``save_state``/``load_state``."""

    def __init__(
        self,
        capture: Callable[[], Any],
        integration: str,
        local_directory: Any,
        options: dict[str, Any],
        default_directory: Callable[[], str | None],
    ) -> None:
        self.local_directory = os.fspath(local_directory)
        self.options = options
        self._default_directory = default_directory
        self._state = TreeState(capture, integration)
        self.manager: Any = None
        #: the step the last restore returned (None: none yet, or nothing complete)
        self.restored_step: int | None = None
        #: where each rank's part came from (``shardpoint.tiers.RestorePlan``)
        self.restore_plan: Any = None

    def open(self) -> Any:
        if self.manager is None:
            from ..tiers import TieredCheckpointManager

            opts = dict(self.options)
            directory = opts.pop("directory", None) or self._default_directory()
            if directory is None:
                raise InvalidArgumentError(
                    "the tiers need a persistent directory: shardpoint_tiers={'directory': ...}"
                )
            self.manager = TieredCheckpointManager(
                self._state, directory, local_directory=self.local_directory, **opts
            )
        return self.manager

    def save(self, step: int) -> Any:
        """``manager.save(step)``: a future, or None when the step is not due."""
        return self.open().save(step)

    def restore(self) -> tuple[int | None, dict[str, Any] | None]:
        """The newest step complete in any tier and its tree, or ``(None, None)``."""
        manager = self.open()
        step = manager.restore_or_initialize()
        self.restored_step, self.restore_plan = step, manager.restore_plan()
        tree, self._state.loaded = self._state.loaded, None
        return step, tree

    def wait(self) -> None:
        if self.manager is not None:
            self.manager.wait()

    def close(self) -> None:
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.close()
