"""The training state of a :class:`ShardpointTrainer` checkpoint, in files under the names
``Trainer`` gives them: ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth``
(``rng_state_<i>.pth`` per process when the world size is above 1) and ``training_args.bin``.

Each is a shardpoint single file (FORMAT.md §10: compressed, every chunk crc-checked, no
pickle) holding what ``torch.save`` would have pickled there: the optimizer's, scheduler's and
scaler's state dicts, the RNG states in ``Trainer``'s own structure (``random.getstate()``,
``np.random.get_state()``, the torch CPU state, the CUDA state(s)), and the training arguments
as a dict of their JSON fields (``torch.save`` pickles the ``TrainingArguments`` object;
``torch.load`` builds that object again from them: ``_hf_args``).

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

import os
import random
from typing import Any

import numpy as np

from ..storage import is_single_file
from ._hf_args import RECORD, args_fields, args_record
from ._state import load_tree, save_tree

__all__ = [
    "ARGS_FILE",
    "FILES",
    "native_rng",
    "read_files",
    "rng_file",
    "save_args",
]

#: part name -> the file ``Trainer`` saves it in
FILES = {"optimizer": "optimizer.pt", "scheduler": "scheduler.pt", "scaler": "scaler.pt"}
#: ``Trainer``'s name for its pickled ``TrainingArguments``
ARGS_FILE = "training_args.bin"


def rng_file(world_size: int, process_index: int) -> str:
    """The RNG file's name as ``Trainer`` names it."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


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


def save_args(args: Any, directory: str, *, integration: str) -> None:
    """``training_args.bin``: the arguments' JSON fields (``TrainingArguments.to_json_string``),
    as a dict, with the record ``torch.load`` builds the object again from (``_hf_args``)."""
    save_tree(
        args_fields(args),
        os.path.join(directory, ARGS_FILE),
        integration=integration,
        compression=None,
        single_file=True,
        metadata={RECORD: args_record(args)},
    )


def _load(path: str, into: Any, integration: str) -> Any:
    return load_tree(path, integration=integration, into=into)


def read_files(
    directory: str,
    *,
    integration: str,
    rng: str = "rng_state.pth",
    optimizer_into: Any = None,
) -> dict[str, Any]:
    """The parts of ``directory`` saved as files (ours, or ``Trainer``'s own pickles of the
    state dicts, read as it reads them: ``weights_only=True``): ``optimizer``,
    ``scheduler``, ``scaler`` and ``rng`` (from the file named ``rng``, falling back to
    ``rng_state.pth``). ``optimizer_into``: the optimizer's live state dict, whose state
    tensors receive their values in place (see ``load_tree``)."""
    out: dict[str, Any] = {}
    for name, file in FILES.items():
        path = os.path.join(directory, file)
        if is_single_file(path):
            into = optimizer_into if name == "optimizer" else None
            out[name] = _load(path, into, integration)
        elif os.path.isfile(path):
            # Trainer's own pickle in one of our directories (copied in by hand): read as
            # Trainer reads it, never skipped (a skipped optimizer is a silently other run)
            import torch

            out[name] = torch.load(path, map_location="cpu", weights_only=True)
    for file in dict.fromkeys((rng, "rng_state.pth")):
        path = os.path.join(directory, file)
        if is_single_file(path):
            out["rng"] = _load(path, None, integration)
            break
    return out
