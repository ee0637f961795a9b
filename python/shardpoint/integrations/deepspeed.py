"""DeepSpeed: ``use_shardpoint(engine)`` after ``deepspeed.initialize``.

It replaces the engine's ``checkpoint_engine`` by a :class:`ShardpointCheckpointEngine`, so
``engine.save_checkpoint(dir)`` / ``engine.load_checkpoint(dir)`` (and the Hugging Face Trainer
and accelerate when they run DeepSpeed) write every file DeepSpeed names —
``<dir>/<tag>/mp_rank_00_model_states.pt``, ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``,
... — as a *directory* of that name holding one shardpoint checkpoint (``state.index`` +
``state.data-*``) instead of a ``torch.save`` pickle. DeepSpeed finds its files by name and
existence, so directories keep its discovery (``latest``, globbing the ZeRO partitions) working.

DeepSpeed chooses its engine from its config and has no setting for a third-party one; the
attribute it keeps (``engine.checkpoint_engine``) is what ``use_shardpoint`` sets.

``use_shardpoint(engine, local_directory=...)`` keeps the checkpoints in the tiers instead
(docs/TIERS.md): each rank's files of a ``save_checkpoint`` in its node-local directory, with
replicas on peers and a persistent tier behind, and ``load_checkpoint`` restoring the newest
step complete in any tier, a rank's reads of files another rank wrote served by that rank
(:mod:`._deepspeed_tiers`).

DeepSpeed's state holds a few Python objects besides tensors and plain values: they are stored
as tagged plain entries from an allow-list (:mod:`._deepspeed_objects`). Never pickled.
Consolidating a ZeRO checkpoint (DeepSpeed's ``zero_to_fp32``): :mod:`.zero_to_fp32`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._deepspeed_objects import OBJECT_TYPES, decode_objects, encode_objects

if TYPE_CHECKING:
    from ._deepspeed_engine import ShardpointCheckpointEngine
    from ._deepspeed_tiers import ShardpointTierEngine

__all__ = [
    "ShardpointCheckpointEngine",
    "ShardpointTierEngine",
    "use_shardpoint",
    "encode_objects",
    "decode_objects",
    "OBJECT_TYPES",
]


def _deepspeed() -> Any:
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "shardpoint.integrations.deepspeed needs DeepSpeed: pip install 'shardpoint[deepspeed]'"
        ) from exc
    return deepspeed


def use_shardpoint(
    engine: Any, *, local_directory: Any = None, tiers: Any = None, **options: Any
) -> Any:
    """Make ``engine`` (a ``DeepSpeedEngine``) save and load checkpoints through shardpoint;
    ``options`` go to :class:`ShardpointCheckpointEngine` (``blocking``, ``compression``,
    ``level``). Returns the engine.

    ``engine.load_checkpoint`` then also tells the checkpoint engine what it restores (the
    engine's module and optimizer, and the call's ``load_optimizer_states``,
    ``load_module_only`` and ``custom_load_fn``), so values are decoded straight into the
    parameters and optimizer state tensors that will receive them.

    ``local_directory`` (node-local: tmpfs or NVMe) turns the multi-tier checkpoints on
    instead: the checkpoint engine is a :class:`ShardpointTierEngine`; each
    ``save_checkpoint(dir)`` stores this rank's files as its part of step
    ``engine.global_steps`` in that directory, with replicas on other nodes, and every
    ``persistent_every`` steps in the persistent tier (``dir``), in the background;
    ``load_checkpoint(dir)`` restores the newest step complete in any tier. ``tiers``: a dict
    of ``TieredCheckpointManager`` arguments (``directory``, ``persistent_every``,
    ``replicas``, ...; docs/TIERS.md)."""
    _deepspeed()
    if local_directory is not None:
        return _use_tiers(engine, local_directory, tiers, options)
    if tiers is not None:
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError("use_shardpoint: tiers= needs local_directory=")
    from ._deepspeed_engine import ShardpointCheckpointEngine

    ours = ShardpointCheckpointEngine(getattr(engine, "_config", None), **options)
    ours.attach(engine)
    if hasattr(engine, "_copy_recovery_script"):
        # DeepSpeed copies its zero_to_fp32.py into each ZeRO checkpoint; that copy torch.loads
        # files these directories replace: put the one that reads them (zero_to_fp32.py here)
        from .zero_to_fp32 import write_recovery_scripts

        engine._copy_recovery_script = write_recovery_scripts
    engine.checkpoint_engine = ours
    return engine


def _use_tiers(engine: Any, local_directory: Any, tiers: Any, options: dict[str, Any]) -> Any:
    from ..errors import InvalidArgumentError
    from ._deepspeed_tiers import ShardpointTierEngine

    if options:
        raise InvalidArgumentError(
            f"use_shardpoint with local_directory: {sorted(options)} are not taken (the tiers' "
            "codec is tiers={'compression': ...})"
        )
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if getattr(engine, "has_moe_layers", False) or isinstance(engine, PipelineEngine):
        raise InvalidArgumentError(
            "use_shardpoint with local_directory: mixture-of-experts and pipeline engines are "
            "not supported by the tiers"
        )
    if bool(getattr(engine, "zero_nvme_offload_optimizer", lambda: False)()):
        raise InvalidArgumentError(
            "use_shardpoint with local_directory: ZeRO's NVMe optimizer offload is not "
            "supported by the tiers (its swap files are outside the state DeepSpeed saves)"
        )
    ours = ShardpointTierEngine(engine, local_directory, tiers)
    ours.attach(engine)
    if hasattr(engine, "_copy_recovery_script"):
        # no recovery scripts: the files are in the tiers, not in the save directory
        engine._copy_recovery_script = lambda save_path: None
    engine.checkpoint_engine = ours
    return engine


def __getattr__(name: str) -> Any:
    if name not in ("ShardpointCheckpointEngine", "ShardpointTierEngine"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _deepspeed()
    from . import _deepspeed_engine, _deepspeed_tiers

    value = getattr(_deepspeed_engine, name, None) or getattr(_deepspeed_tiers, name)
    globals()[name] = value
    return value
