"""``StateDictCheckpoint``: the state dict a ``torch.distributed.checkpoint`` user hands
``dcp.save``/``dcp.load`` (tensors, nested dicts, ``Stateful`` objects such as the tutorial's
``AppState``), as the checkpoint object of :class:`shardpoint.TieredCheckpointManager`.

DCP writes one checkpoint of the whole job, deduplicated across ranks (a replicated tensor is
written by one rank only), so a rank cannot restore from what it wrote alone. The tiers keep
each rank's *own* state instead, which is what a node-local tier and its peer replicas need.
This object gives a DCP user's state dict that shape with DCP's own semantics: on a save,
each ``Stateful`` value's ``state_dict()`` is taken; on a restore, each ``Stateful`` value gets
``load_state_dict(...)``, tensors are copied into in place (as ``dcp.load`` fills them), other
values are replaced in the dict.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from ..errors import CheckpointError
from .tensors import load, save

__all__ = ["StateDictCheckpoint"]


def _stateful(value: Any) -> bool:
    # DCP's Stateful protocol: both methods (a module or optimizer is one too)
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


class StateDictCheckpoint:
    """The ``state_dict`` you would pass to ``dcp.save``/``dcp.load``, saved per rank by
    :class:`shardpoint.TieredCheckpointManager` (docs/TIERS.md, "DCP users")::

        manager = sp.CheckpointManager(sptorch.StateDictCheckpoint({"app": AppState(model, opt)}),
                                       "s3://bucket/run", local_directory="/dev/shm/ckpt")

    The codec of the parts is the manager's (``compression``, default none). Values must be plain tensors, numpy arrays and plain Python values after ``state_dict()``:
    sharded ``DTensor``/``ShardedTensor`` values (FSDP2, TP) are refused by the codec.
    """

    def __init__(self, state_dict: MutableMapping[str, Any]) -> None:
        if not isinstance(state_dict, MutableMapping):
            raise CheckpointError(
                f"StateDictCheckpoint takes the dict dcp.save takes, got {type(state_dict)!r}"
            )
        self.state_dict = state_dict

    def _tree(self) -> dict[str, Any]:
        return {k: v.state_dict() if _stateful(v) else v for k, v in self.state_dict.items()}

    def write(self, prefix: str, blocking: bool = True, compression: str | None = None) -> Any:
        """Save this rank's state at ``prefix``; with ``blocking=False`` return once the
        tensors are copied into host buffers (a future of the rest)."""
        return save(self._tree(), prefix, blocking=blocking, compression=compression)

    def restore(self, prefix: str, verify: bool = True) -> None:
        """Put the state saved at ``prefix`` back, as ``dcp.load`` would."""
        loaded = load(prefix, map_location="cpu", verify=verify)
        missing = sorted(set(self.state_dict) - set(loaded))
        if missing:
            raise CheckpointError(f"{prefix}: the checkpoint holds no {missing}")
        for key, value in list(self.state_dict.items()):
            if _stateful(value):
                value.load_state_dict(loaded[key])
            else:
                self.state_dict[key] = _fill(value, loaded[key], key)


def _fill(target: Any, value: Any, where: str) -> Any:
    """``value`` put into ``target``: tensors copied in place (same shape), dicts filled key
    by key, anything else replaced."""
    import torch

    if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
        if target.shape != value.shape:
            raise CheckpointError(
                f"{where}: stored shape {tuple(value.shape)} differs from {tuple(target.shape)}"
            )
        with torch.no_grad():
            target.copy_(value)
        return target
    if isinstance(target, MutableMapping) and isinstance(value, dict):
        for k in list(value):
            target[k] = _fill(target.get(k), value[k], f"{where}/{k}")
        return target
    return value
