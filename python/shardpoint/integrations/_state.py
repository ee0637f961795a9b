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

from .. import files
from ..errors import NotFoundError, UnsupportedDTypeError

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
    return files.exists(part_prefix(directory, name))


def save_tree(
    tree: Any,
    prefix: str,
    *,
    integration: str,
    blocking: bool = True,
    compression: str | None = "zstd",
    level: int | None = None,
    durable: bool = True,
) -> Any:
    """Save a nested state (dicts/lists of tensors and plain values) as checkpoint ``prefix``.

    Returns ``None``, or the save's future when ``blocking=False``. A value that cannot be
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
            metadata={WRITER_KEY: integration},
        )
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(f"{integration} checkpoint {prefix!r}: {e}") from e


def load_tree(prefix: str, *, integration: str, device: Any = "cpu") -> Any:
    """Load a state saved by :func:`save_tree`; a missing part raises :class:`NotFoundError`
    saying which file is missing and which integration expected it."""
    from .. import torch as sptorch

    if not files.exists(prefix):
        where = Path(prefix).parent
        found = sorted(os.listdir(where))[:8] if where.is_dir() else None
        raise NotFoundError(
            f"{integration}: no shardpoint checkpoint at {prefix!r} ({prefix}.index is missing; "
            + (f"the directory holds {found})" if found is not None else "no such directory)")
            + ". A save killed before its commit leaves no index: resume from an earlier "
            "checkpoint."
        )
    return sptorch.load(prefix, device=device)


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
    """Set the global RNGs to a state from :func:`capture_rng`."""
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"]), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state(
        (nps["kind"], nps["keys"], nps["pos"], nps["has_gauss"], nps["cached_gaussian"])
    )
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class PendingSaves:
    """Saves started with ``blocking=False`` that have not committed yet, by path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Any]] = {}

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
