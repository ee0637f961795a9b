"""A plain ``Accelerator.load_state`` reading a directory ``ShardpointAccelerator.save_state``
wrote, in any process where shardpoint is installed.

Such a directory keeps the optimizers, schedulers, dataloaders, scaler, registered objects,
RNG states and step (and with ``shardpoint_weights="compressed"`` the weights) in
``shardpoint.index``, not in ``optimizer.bin``, ``random_states_0.pkl``... A next script that
resumes with accelerate's own ``Accelerator`` failed on the first missing pickle, with an
error that never said "shardpoint". This front, installed once ``accelerate.accelerator`` has
run (standard library only until a directory turns out to be ours), resolves the directory as
``Accelerator.load_state`` does (``input_dir``, or the newest ``checkpoints/checkpoint_<i>``
with automatic naming) and, when it holds our part and not accelerate's pickles, loads it with
``shardpoint.integrations.accelerate.load_directory`` (the code ``ShardpointAccelerator`` runs).
``ShardpointAccelerator`` itself, FSDP, DeepSpeed, Megatron-LM and XLA runs, and every other
directory reach accelerate's method unchanged. ``SHARDPOINT_TORCH_LOAD=0`` makes such a load
raise ``ValueError`` naming shardpoint.
"""

from __future__ import annotations

import os
import re

from . import _MARK, dress, index_or_cut, missing_index, refuse_missing_index

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["patch_accelerator"]

#: distributed types whose frameworks write the checkpoint themselves
_NATIVE_TYPES = ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA")
#: the part ``ShardpointAccelerator.save_state`` writes into each directory
_PART = ("shardpoint",)
_NUMBER = re.compile(r"[\/]?([0-9]+)(?=[^\/]*$)")


def _directory(acc: Any, input_dir: Any) -> str | None:
    """The directory ``Accelerator.load_state`` would read, or ``None`` when it would raise
    (its own error is kept)."""
    if input_dir is not None:
        d = os.path.expanduser(os.fspath(input_dir))
        return d if os.path.isdir(d) else None
    config = getattr(acc, "project_configuration", None)
    if not getattr(config, "automatic_checkpoint_naming", False):
        return None
    root = os.path.join(acc.project_dir, "checkpoints")
    folders = [os.path.join(root, f) for f in os.listdir(root)]
    numbered = [(int(m[0]), f) for f in folders if (m := _NUMBER.findall(f))]
    return max(numbered)[1] if numbered else None


def _ours(acc: Any, input_dir: Any, lost: bool = False) -> str | None:
    """The directory to load through shardpoint, or ``None``; with ``lost``, the directory
    whose ``shardpoint.index`` is gone while its data shards are there. Never raises."""
    try:
        if hasattr(type(acc), "_sp_native"):  # ShardpointAccelerator loads its own
            return None
        kind = getattr(getattr(acc, "distributed_type", None), "name", "")
        if kind in _NATIVE_TYPES:
            return None
        d = _directory(acc, input_dir)
        if d is None:
            return None
        if lost:
            if missing_index(d, _PART) is None:
                return None
        elif not index_or_cut(os.path.join(d, "shardpoint.index")):
            return None
        # accelerate's own checkpoint (every one holds its RNG pickle) stays accelerate's
        if any(n.startswith("random_states_") for n in os.listdir(d)):
            return None
        return d
    except (OSError, ValueError, TypeError, AttributeError, IndexError):
        return None


def _front(
    original: Callable[..., Any], enabled: Callable[[], bool], env: str
) -> Callable[..., Any]:
    def load_state(self: Any, input_dir: Any = None, load_kwargs: Any = None, **kwargs: Any) -> Any:
        d = _ours(self, input_dir)
        if d is None:
            lost = _ours(self, input_dir, lost=True) if enabled() else None
            if lost is not None:
                # accelerate's own error was "No such file or directory: '.../optimizer.bin'";
                # ours names the missing index (still a FileNotFoundError)
                refuse_missing_index(lost, "Accelerator.load_state", _PART)
            return original(self, input_dir, load_kwargs, **kwargs)
        if not enabled():
            raise ValueError(
                f"{d!r} was written by shardpoint's ShardpointAccelerator: its states are in "
                f"shardpoint.index, and their reading is turned off ({env}=0); load it with "
                f"ShardpointAccelerator (shardpoint.integrations.accelerate), or unset {env}"
            )
        from shardpoint.integrations.accelerate import load_directory

        load_directory(self, d, kwargs.get("strict", True))
        return None

    dress(load_state, original)
    return load_state


def patch_accelerator(module: ModuleType, enabled: Callable[[], bool], env: str) -> None:
    """Front ``Accelerator.load_state`` (a subclass that overrides it keeps its override)."""
    owner = getattr(module, "Accelerator", None)
    if not isinstance(owner, type):
        return
    current = owner.__dict__.get("load_state")
    if current is None or hasattr(current, _MARK):
        return
    owner.load_state = _front(current, enabled, env)  # type: ignore[attr-defined]
