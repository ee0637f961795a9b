"""A plain transformers ``Trainer`` resuming from a checkpoint ``ShardpointTrainer`` wrote, in
any process where shardpoint is installed.

Such a ``checkpoint-N`` keeps the optimizer, scheduler, scaler and RNG states in
``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` and ``rng_state.pth``, shardpoint single
files that ``Trainer``'s own methods ``torch.load`` (whose front reads them), and with
``shardpoint_weights="compressed"`` the weights in ``shardpoint.index``. Checkpoints of
earlier versions keep the states in ``shardpoint.index`` too: ``Trainer`` finds no
``optimizer.pt`` there and goes on *silently* with a fresh optimizer, a restarted schedule and
other random draws (with the weights compressed it says "Can't find a valid checkpoint", never
"shardpoint"). This front,
installed once ``transformers.trainer`` has run (standard library only until a checkpoint
turns out to be ours), sends each of those loading steps to
``shardpoint.integrations._hf_resume`` when the checkpoint holds our part and not the native
file that step reads. ``ShardpointTrainer`` (which loads its own checkpoints), DeepSpeed and
FSDP trainers (their engines write their own states), and every other checkpoint reach
``Trainer``'s own methods unchanged. With ``SHARDPOINT_TORCH_LOAD=0`` a resume from such a
checkpoint raises ``ValueError`` naming shardpoint instead of losing the states silently.
"""

from __future__ import annotations

import os

from . import _MARK, dress, index_or_cut, local_path, refuse_missing_index
from .pretrained import _native, check_recorded_weights, refuse_lost_index

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["patch_trainer"]

#: Trainer's method -> (the native files that step reads, the shardpoint function)
_STEPS: dict[str, tuple[tuple[str, ...], str]] = {
    "_load_from_checkpoint": ((), "load_model"),
    "_load_optimizer_and_scheduler": (
        ("optimizer.pt", "optimizer.bin"),
        "load_optimizer_and_scheduler",
    ),
    "_load_scaler": (("scaler.pt",), "load_scaler"),
    "_load_rng_state": (("rng_state.pth",), "load_rng_state"),
}
_WHAT = {
    "_load_from_checkpoint": "model weights",
    "_load_optimizer_and_scheduler": "optimizer and scheduler states",
    "_load_scaler": "gradient scaler state",
    "_load_rng_state": "RNG states",
}


def _has_native(directory: str, method: str) -> bool:
    names = os.listdir(directory)
    if method == "_load_from_checkpoint":
        return any(_native(directory, n) for n in names)
    if method == "_load_rng_state" and any(
        n.startswith("rng_state_") and n.endswith(".pth") for n in names
    ):
        return True
    # ShardpointTrainer's own optimizer.pt... (shardpoint single files) count: Trainer's method
    # torch.loads them, and torch.load's front reads ours
    return any(n in names for n in _STEPS[method][0])


def _plain(trainer: Any) -> bool:
    """Whether ``trainer``'s engine leaves the checkpoint to ``Trainer``'s own methods (not
    DeepSpeed or FSDP, which write their own states)."""
    return not (
        getattr(trainer, "is_deepspeed_enabled", False)
        or getattr(trainer, "is_fsdp_enabled", False)
    )


def _ours(trainer: Any, checkpoint: Any, method: str) -> bool:
    """Whether ``trainer`` (a plain Trainer) should read this step from our part. Never
    raises."""
    try:
        if hasattr(type(trainer), "_sp_has"):  # ShardpointTrainer loads its own checkpoints
            return False
        if not _plain(trainer):
            return False
        if not isinstance(checkpoint, str | os.PathLike):
            return False
        d = os.fspath(checkpoint)
        if not isinstance(d, str) or not os.path.isdir(d):
            return False
        if not index_or_cut(os.path.join(d, "shardpoint.index")):
            return False
        return not _has_native(d, method)
    except (OSError, ValueError, TypeError):
        return False


def _refuse_lost_states(trainer: Any, checkpoint: Any) -> None:
    """A checkpoint of ours with no ``optimizer.pt`` whose ``shardpoint.index`` is gone while
    its data shards remain: an earlier version kept the optimizer, scheduler and RNG states
    there, so Trainer would go on silently with a fresh optimizer (its weights, whole in
    ``model.safetensors``, loaded without complaint). Raises the lost-index error
    (``CorruptCheckpointError``, a ``ValueError``) instead. A checkpoint whose ``optimizer.pt``
    is there lost only the weights' crc records, and resumes."""
    if not _plain(trainer):
        return
    d = local_path(checkpoint)
    try:
        if d is None or not os.path.isdir(d) or _has_native(d, "_load_optimizer_and_scheduler"):
            return
    except OSError:
        return
    refuse_missing_index(
        d, "Trainer resume (optimizer and scheduler states)", ("shardpoint",), True
    )


def _front(
    method: str, original: Callable[..., Any], enabled: Callable[[], bool], env: str
) -> Callable[..., Any]:
    # the checkpoint argument's name (`resume_from_checkpoint`, `checkpoint`), if passed by it
    name = original.__code__.co_varnames[1]

    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        checkpoint: Any = args[0] if args else kwargs.get(name)
        if not _ours(self, checkpoint, method):
            own = hasattr(type(self), "_sp_has")  # ShardpointTrainer checks its weights itself
            if method == "_load_from_checkpoint" and enabled() and not own and _plain(self):
                # Trainer's own words would be "Can't find a valid checkpoint" (a ValueError)
                refuse_lost_index(checkpoint, "Trainer resume", corrupt=True)
                check_recorded_weights(checkpoint)  # Trainer reads model.safetensors unchecked
            elif method == "_load_optimizer_and_scheduler" and enabled() and not own:
                _refuse_lost_states(self, checkpoint)
            return original(self, *args, **kwargs)
        rest = {k: v for k, v in kwargs.items() if k != name}
        where: str = os.fspath(checkpoint)
        if not enabled():
            raise ValueError(
                f"{where!r} was written by shardpoint's ShardpointTrainer: its "
                f"{_WHAT[method]} are in shardpoint.index, and their reading is turned off "
                f"({env}=0); resume with ShardpointTrainer "
                f"(shardpoint.integrations.hf_trainer), or unset {env}"
            )
        from shardpoint.integrations import _hf_resume

        step = getattr(_hf_resume, _STEPS[method][1])
        return step(self, where, *args[1:], **rest)

    dress(load, original)
    return load


def patch_trainer(module: ModuleType, enabled: Callable[[], bool], env: str) -> None:
    """Front ``Trainer``'s loading steps (its own methods; a subclass that overrides one keeps
    its override)."""
    owner = getattr(module, "Trainer", None)
    if not isinstance(owner, type):
        return
    for method in _STEPS:
        current = owner.__dict__.get(method)
        if current is None or hasattr(current, _MARK):
            continue
        setattr(owner, method, _front(method, current, enabled, env))
