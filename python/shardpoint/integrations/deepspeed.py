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

DeepSpeed's state holds a few Python objects besides tensors and plain values: they are stored
as tagged plain entries from an allow-list (:mod:`._deepspeed_objects`). Never pickled.
Consolidating a ZeRO checkpoint (DeepSpeed's ``zero_to_fp32``): :mod:`.zero_to_fp32`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._deepspeed_objects import OBJECT_TYPES, decode_objects, encode_objects

if TYPE_CHECKING:
    from ._deepspeed_engine import ShardpointCheckpointEngine

__all__ = [
    "ShardpointCheckpointEngine",
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


def use_shardpoint(engine: Any, **options: Any) -> Any:
    """Make ``engine`` (a ``DeepSpeedEngine``) save and load checkpoints through shardpoint;
    ``options`` go to :class:`ShardpointCheckpointEngine` (``blocking``, ``compression``,
    ``level``). Returns the engine.

    ``engine.load_checkpoint`` then also tells the checkpoint engine what it restores (the
    engine's module and optimizer, and the call's ``load_optimizer_states``,
    ``load_module_only`` and ``custom_load_fn``), so values are decoded straight into the
    parameters and optimizer state tensors that will receive them."""
    _deepspeed()
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


def __getattr__(name: str) -> Any:
    if name != "ShardpointCheckpointEngine":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _deepspeed()
    from ._deepspeed_engine import ShardpointCheckpointEngine

    globals()[name] = ShardpointCheckpointEngine
    return ShardpointCheckpointEngine
