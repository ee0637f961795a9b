"""A plain transformers ``Trainer`` resuming from a checkpoint :class:`ShardpointTrainer` wrote
(the front ``_shardpoint_loaders/trainer_resume.py`` installs once ``transformers.trainer`` has
run).

Why: such a ``checkpoint-N`` keeps its weights in ``shardpoint.index`` with
``shardpoint_weights="compressed"``, and a checkpoint of an earlier version keeps its optimizer,
scheduler, scaler and RNG states there too, not in ``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth`` (this version writes those files, in shardpoint's format, which ``Trainer``'s
own methods ``torch.load``: ``_hf_files``). A user's next script that resumes such a checkpoint
with the plain ``Trainer`` found no ``optimizer.pt`` and silently went on with a fresh
optimizer, a restarted schedule and other random draws: a different training, no error. With
the front each of the Trainer's loading steps reads its state from the part, as
``ShardpointTrainer`` itself does (the tests compare losses and final weights with an
uninterrupted run).

The part is read once per trainer and checkpoint (into the model's parameters where they are
plain CPU tensors); the large states (model, optimizer, scheduler) are dropped from the cache
once handed over, the small ones (scaler, RNG) kept for the Trainer's second RNG call.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from ..errors import CheckpointError
from ._hf_files import read_files, rng_file
from ._state import load_tree, module_targets, part_prefix, restore_rng

__all__ = [
    "load_model",
    "load_optimizer_and_scheduler",
    "load_rng_state",
    "load_scaler",
    "read_part",
]

_PART = "shardpoint"
_NAME = "hf_trainer"
#: trainer -> (the checkpoint's absolute path, its part's tree, entries handed over popped)
_TREES: weakref.WeakKeyDictionary[Any, tuple[str, dict[str, Any]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def read_part(
    trainer: Any, checkpoint: str, model: Any = None, *, files: bool = True
) -> dict[str, Any]:
    """Every part of a ``ShardpointTrainer`` checkpoint, read once: ``model`` (the module the
    model part restores) receives its values in place, as do the trainer's optimizer's state
    tensors when it has stepped before. ``files``: also read the states saved in files under
    ``Trainer``'s names (``optimizer.pt``...: ``_hf_files``), which replace the part's entries
    of the same name (checkpoints of earlier versions hold them in the part). Shared by
    ``ShardpointTrainer`` and the plain-Trainer front."""
    opt = getattr(trainer, "optimizer", None)
    # state tensors exist only when this trainer trained before: they receive the values
    opt_into = opt.state_dict() if opt is not None and opt.state else None
    into = {
        # the part holds the model only with shardpoint_weights="compressed"
        "model": module_targets(model) if model is not None else None,
        "optimizer": opt_into,
    }
    tree = dict(load_tree(part_prefix(checkpoint, _PART), integration=_NAME, into=into))
    if files:
        args = getattr(trainer, "args", None)
        rng = rng_file(getattr(args, "world_size", 1), getattr(args, "process_index", 0))
        tree.update(read_files(checkpoint, integration=_NAME, rng=rng, optimizer_into=opt_into))
    return tree


def _tree(trainer: Any, checkpoint: str, model: Any = None) -> dict[str, Any]:
    key = os.path.abspath(checkpoint)
    with _LOCK:
        got = _TREES.get(trainer)
    if got is not None and got[0] == key:
        return got[1]
    # the states in files (optimizer.pt...) reach Trainer's own methods through torch.load:
    # this front reads the part only (the weights, and an earlier version's states)
    tree = read_part(trainer, checkpoint, model, files=False)
    with _LOCK:
        _TREES[trainer] = (key, tree)
    return tree


def _take(trainer: Any, checkpoint: str, name: str, model: Any = None) -> Any:
    """Part ``name`` of the checkpoint, dropped from the cache (read once)."""
    return _tree(trainer, checkpoint, model).pop(name, None)


def load_model(trainer: Any, checkpoint: str, model: Any = None) -> None:
    """``Trainer._load_from_checkpoint`` for a checkpoint whose weights are in the part
    (``shardpoint_weights="compressed"``): loaded strictly, as ``ShardpointTrainer`` loads
    them."""
    target = model if model is not None else trainer.model
    state = _take(trainer, checkpoint, "model", target)
    if state is None:
        raise CheckpointError(
            f"hf_trainer: {checkpoint!r} holds no model weights (no model.safetensors and none "
            "in its shardpoint part)"
        )
    target.load_state_dict(state, strict=True)


def load_optimizer_and_scheduler(trainer: Any, checkpoint: str) -> None:
    """``Trainer._load_optimizer_and_scheduler`` from the part."""
    opt = _take(trainer, checkpoint, "optimizer")
    if opt is not None and trainer.optimizer is not None:
        trainer.optimizer.load_state_dict(opt)
    sched = _take(trainer, checkpoint, "scheduler")
    if sched is not None and trainer.lr_scheduler is not None:
        trainer.lr_scheduler.load_state_dict(sched)


def load_scaler(trainer: Any, checkpoint: str) -> None:
    """``Trainer._load_scaler`` from the part."""
    state = _tree(trainer, checkpoint).get("scaler")
    scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
    if state is not None and scaler is not None:
        scaler.load_state_dict(state)


def load_rng_state(trainer: Any, checkpoint: str) -> None:
    """``Trainer._load_rng_state`` from the part (rank 0's generators on every process, as
    ``ShardpointTrainer`` restores them)."""
    state = _tree(trainer, checkpoint).get("rng")
    if state is not None:
        restore_rng(state)
