"""JAX pytrees in shardpoint checkpoints: ``save`` / ``restore`` and an Orbax handler.

>>> import shardpoint.jax as spj
>>> spj.save({"params": {"dense": {"kernel": w}}, "step": 3}, "ckpt/run")   # doctest: +SKIP
>>> state = spj.restore("ckpt/run", target=abstract_state)                   # doctest: +SKIP

Keys are readable paths (``params/dense/kernel``); sharded ``jax.Array`` leaves are written
shard by shard and restored onto any mesh or sharding (see :mod:`.checkpoint`). The Orbax
integration (``ShardpointCheckpointHandler``, ``ShardpointSave``, ``ShardpointRestore``) is
in :mod:`shardpoint.jax.orbax`, imported on first use.

jax is an optional dependency (``pip install shardpoint[jax]``): this package imports without
it, and numpy-only trees save and restore without it.
"""

from __future__ import annotations

from typing import Any

from .checkpoint import restore, save

__all__ = ["save", "restore", "ShardpointCheckpointHandler", "ShardpointSave", "ShardpointRestore"]

_ORBAX_NAMES = ("ShardpointCheckpointHandler", "ShardpointSave", "ShardpointRestore")


def __getattr__(name: str) -> Any:
    if name in _ORBAX_NAMES:
        from . import orbax

        return getattr(orbax, name)
    raise AttributeError(f"module 'shardpoint.jax' has no attribute {name!r}")
