"""What every trainer integration shares: a nested state saved as one checkpoint in a
directory, loaded back with a clear error, and the process's RNG states as plain arrays.

A trainer names a *directory* per checkpoint (Lightning's ``epoch=0-step=10.ckpt``, HF's
``checkpoint-10``, accelerate's ``checkpoint_3``); inside it each part is one shardpoint
checkpoint prefix (``<dir>/<name>.index`` + ``<dir>/<name>.data-*``) whose index rename commits
it, so a save killed mid-way never replaces a committed part with a partial one.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from .. import storage
from ..errors import NotFoundError, UnsupportedDTypeError
from ..storage.paths import lost_index

__all__ = [
    "PendingSaves",
    "save_tree",
    "load_tree",
    "part_prefix",
    "has_part",
    "capture_rng",
    "restore_rng",
]

#: metadata key naming the integration that wrote a checkpoint (read by ``shardpoint inspect``)
WRITER_KEY = "shardpoint.integration"


def part_prefix(directory: str | os.PathLike[str], name: str) -> str:
    """The checkpoint prefix of part ``name`` inside a checkpoint directory."""
    return os.path.join(os.fspath(directory), name)


def has_part(directory: str | os.PathLike[str], name: str) -> bool:
    """Whether part ``name`` of the checkpoint directory was committed."""
    return storage.exists(part_prefix(directory, name))


def save_tree(
    tree: Any,
    prefix: str,
    *,
    integration: str,
    blocking: bool = True,
    compression: str | None = "zstd",
    level: int | None = None,
    durable: bool = True,
    single_file: bool | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Any:
    """Save a nested state (dicts/lists of tensors and plain values) as checkpoint ``prefix``
    (``single_file``: as for :func:`shardpoint.torch.save`; ``optimizer.pt`` is one file;
    ``metadata``: more entries beside the integration's name).

    Returns ``None``, or the save's future when ``blocking=False`` (the saver commits in call
    order: a save submitted after another commits after it). A value that cannot be
    stored without pickle raises :class:`UnsupportedDTypeError` naming its path and the
    integration, before anything is written."""
    from .. import torch as sptorch

    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    try:
        return sptorch.save(
            tree,
            prefix,
            compression=compression,
            level=level,
            durable=durable,
            blocking=blocking,
            metadata={**(metadata or {}), WRITER_KEY: integration},
            single_file=single_file,
        )
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(f"{integration} checkpoint {prefix!r}: {e}") from e


def load_tree(
    prefix: str, *, integration: str, device: Any = "cpu", into: Any = None, copy: bool = False
) -> Any:
    """Load a state saved by :func:`save_tree`; a missing part raises :class:`NotFoundError`
    saying which file is missing and which integration expected it.

    ``into``: the live state the checkpoint restores, nested as it was saved (e.g.
    ``{"models": [model.state_dict()], "optimizers": [opt.state_dict()]}``), or a function of
    the checkpoint's skeleton (its nesting, leaves ``None``) returning it (it may raise to
    refuse the checkpoint before anything is read). Values whose tensor there is plain CPU
    memory of the stored dtype and shape are decoded straight into it (one batched parallel
    read, checksums checked) and that tensor is returned in the tree: the framework's own
    ``load_state_dict`` then finds the value already in place. The other values come back as
    fresh tensors, as without ``into``. A checksum error may leave some of those tensors
    holding new values. ``copy``: CPU tensors in private memory, not views of the mapped
    files (what ``torch.load`` gives by default)."""
    from ..torch.tensors import _load

    if not storage.exists(prefix):
        raise missing_part(prefix, integration)
    return _load(prefix, device, None, True, copy, None, into=into)


def missing_part(prefix: str, integration: str) -> NotFoundError:
    """The error for a part whose index is missing: data shards without it are a lost index
    (:func:`~shardpoint.storage.paths.lost_index`, the words every front uses); otherwise
    it says what the directory holds."""
    lost = lost_index(prefix, integration)
    if lost is not None:
        return lost
    where = Path(prefix).parent
    found = sorted(os.listdir(where))[:8] if where.is_dir() else None
    return NotFoundError(
        f"{integration}: no shardpoint checkpoint at {prefix!r} ({prefix}.index is missing; "
        + (f"the directory holds {found})" if found is not None else "no such directory)")
        + ". A save killed before its commit leaves no index: resume from an earlier "
        "checkpoint."
    )


def module_targets(module: Any) -> Any:
    """``module.state_dict()`` as ``into`` targets of :func:`load_tree`, or ``None`` (values
    come back fresh) when the module customises loading: state-dict hooks, a
    ``_load_from_state_dict`` override (the rule ``sptorch.load_model`` uses) or a
    ``load_state_dict`` override may rename, transform or skip values, so only their own
    code may write the parameters. Modules with tensors off the CPU load fresh CPU tensors
    too (``load_state_dict`` copies them over, as before)."""
    from ..torch.models import _plain_cpu_module

    return module.state_dict() if _plain_cpu_module(module) else None


# ---------------------------------------------------------------------------------------------
# RNG states as arrays (Python's Mersenne Twister state is a tuple of 625 ints: stored as one
# uint64 array instead of 625 entries)
# ---------------------------------------------------------------------------------------------


def capture_rng(*, cuda: bool | None = None) -> dict[str, Any]:
    """The states of Python's, numpy's and torch's (CPU, and CUDA when available) global RNGs."""
    import torch

    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": np.asarray(mt, dtype=np.uint64),
            "gauss": gauss,
        },
        "numpy": {
            "kind": str(kind),
            "keys": np.asarray(keys),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "cpu": torch.random.get_rng_state(),
    }
    if cuda if cuda is not None else torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set the global RNGs to a state from :func:`capture_rng`, or to one in the structure
    Hugging Face's ``Trainer`` saves (``random.getstate()`` and ``np.random.get_state()``
    tuples; ``cuda`` one state or a list of them)."""
    import torch

    py = state["python"]
    nps = state["numpy"]
    if isinstance(py, tuple | list):  # Trainer's structure (rng_state.pth)
        random.setstate((int(py[0]), tuple(int(x) for x in py[1]), py[2]))
        np.random.set_state(tuple(nps))
    else:
        random.setstate((py["version"], tuple(int(x) for x in py["state"]), py["gauss"]))
        np.random.set_state(
            (nps["kind"], nps["keys"], nps["pos"], nps["has_gauss"], nps["cached_gaussian"])
        )
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, list | tuple):
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda)


class PendingSaves:
    """Saves started with ``blocking=False`` that have not committed yet, by path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # A pickled copy (accelerate's own test pickles a prepared Accelerator; spawned
        # processes receive one) owns none of this process's background saves: it starts
        # with none, and the lock is not picklable anyway.
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def add(self, path: str, fut: Future[Any]) -> None:
        with self._lock:
            self._futures[path] = fut

    def wait(self, path: str | None = None) -> None:
        with self._lock:
            if path is None:
                futs = list(self._futures.values())
                self._futures.clear()
            else:
                f = self._futures.pop(path, None)
                futs = [f] if f is not None else []
        for f in futs:
            f.result()  # re-raises the save's error here
