"""The training state of a :class:`ShardpointTrainer` checkpoint, in files under the names
``Trainer`` gives them: ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth``
(``rng_state_<i>.pth`` per process when the world size is above 1) and ``training_args.bin``.

Each is a shardpoint single file (FORMAT.md §10: compressed, every chunk crc-checked, no
pickle) holding what ``torch.save`` would have pickled there: the optimizer's, scheduler's and
scaler's state dicts, the RNG states in ``Trainer``'s own structure (``random.getstate()``,
``np.random.get_state()``, the torch CPU state, the CUDA state(s)), and the training arguments
as a dict of their JSON fields (``torch.save`` pickles the ``TrainingArguments`` object).

Why the Trainer's names, not one part: a checkpoint directory is read by more than
``ShardpointTrainer``. ``Trainer``'s own resume checks for these files by name and
``torch.load`` s them (the front shardpoint installs reads ours), users open them by hand
(``torch.load("checkpoint-500/optimizer.pt")``), and transformers' own checkpoint tests assert
that they exist. Earlier versions kept these states in ``shardpoint.index``; such checkpoints
still load (:func:`read_files` finds no file and the part's entries are used).

The files are written before the part (``shardpoint.index``), whose commit still marks the
checkpoint complete: a save killed in between leaves no committed part, and resuming skips it.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import numpy as np

__all__ = [
    "ARGS_FILE",
    "FILES",
    "is_shardpoint_file",
    "native_rng",
    "read_files",
    "rng_file",
    "save_args",
    "save_file",
]

#: part name -> the file ``Trainer`` saves it in
FILES = {"optimizer": "optimizer.pt", "scheduler": "scheduler.pt", "scaler": "scaler.pt"}
#: ``Trainer``'s name for its pickled ``TrainingArguments``
ARGS_FILE = "training_args.bin"
_MAGIC = b"SPSINGLE"  # FORMAT.md §10


def rng_file(world_size: int, process_index: int) -> str:
    """The RNG file's name as ``Trainer`` names it."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


def is_shardpoint_file(path: str) -> bool:
    """Whether ``path`` is a shardpoint single file (never raises)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def native_rng(distributed: bool) -> dict[str, Any]:
    """The RNG states as ``Trainer._save_rng_state`` collects them (its structure, so that
    ``Trainer``'s own ``_load_rng_state`` restores them from the file)."""
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        cuda = torch.cuda.random
        state["cuda"] = cuda.get_rng_state_all() if distributed else cuda.get_rng_state()
    return state


def save_file(
    tree: Any,
    path: str,
    *,
    integration: str,
    blocking: bool,
    compression: str | None,
    level: int | None,
) -> Any:
    """Write ``tree`` as the single file ``path``; returns the save's future when
    ``blocking=False`` (the saver commits in call order: a part submitted after it commits
    after it)."""
    from ..errors import UnsupportedDTypeError
    from ..torch import save
    from ._state import WRITER_KEY

    try:
        return save(
            tree,
            path,
            compression=compression,
            level=level,
            blocking=blocking,
            single_file=True,
            metadata={WRITER_KEY: integration},
        )
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(f"{integration} checkpoint file {path!r}: {e}") from e


def save_args(args: Any, directory: str, *, integration: str) -> None:
    """``training_args.bin``: the arguments' JSON fields (``TrainingArguments.to_json_string``),
    as a dict."""
    save_file(
        json.loads(args.to_json_string()),
        os.path.join(directory, ARGS_FILE),
        integration=integration,
        blocking=True,
        compression=None,
        level=None,
    )


def _load(path: str, into: Any, integration: str) -> Any:
    from ._state import load_tree

    return load_tree(path, integration=integration, into=into)


def read_files(
    directory: str,
    *,
    integration: str,
    rng: str = "rng_state.pth",
    optimizer_into: Any = None,
) -> dict[str, Any]:
    """The parts of ``directory`` saved as files (those present and ours): ``optimizer``,
    ``scheduler``, ``scaler`` and ``rng`` (from the file named ``rng``, falling back to
    ``rng_state.pth``). ``optimizer_into``: the optimizer's live state dict, whose state
    tensors receive their values in place (see ``load_tree``)."""
    out: dict[str, Any] = {}
    for name, file in FILES.items():
        path = os.path.join(directory, file)
        if is_shardpoint_file(path):
            into = optimizer_into if name == "optimizer" else None
            out[name] = _load(path, into, integration)
    for file in dict.fromkeys((rng, "rng_state.pth")):
        path = os.path.join(directory, file)
        if is_shardpoint_file(path):
            out["rng"] = _load(path, None, integration)
            break
    return out
