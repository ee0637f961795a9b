"""The one place where the object-graph layer touches storage.

Everything above this module speaks numpy values and key strings; everything below is the
storage facade (``shardpoint.files``: ``save_file``, ``open``, ``exists``, ``remove``). Keeping
the boundary this small lets the object graph be tested against any storage with that API.
"""

from __future__ import annotations

import os
from typing import Any

from .. import files
from .naming import OBJECT_GRAPH_KEY

__all__ = ["write_checkpoint", "open_reader", "checkpoint_exists", "remove_checkpoint"]


def write_checkpoint(prefix: str, values: dict[str, Any], graph_json: bytes) -> None:
    """Write ``values`` plus the object graph atomically at ``prefix`` (parents created)."""
    parent = os.path.dirname(prefix)
    if parent:
        os.makedirs(parent, exist_ok=True)
    payload = dict(values)
    payload[OBJECT_GRAPH_KEY] = graph_json
    files.save_file(payload, prefix)


def open_reader(prefix: str) -> Any:
    """Lazy reader over the checkpoint at ``prefix`` (raises NotFoundError when absent)."""
    return files.open(prefix)


def checkpoint_exists(prefix: str) -> bool:
    """True when ``prefix.index`` exists (the index commits a checkpoint)."""
    return bool(files.exists(prefix))


def remove_checkpoint(prefix: str) -> None:
    """Delete a checkpoint: index first, so a crash never leaves an index without data."""
    files.remove(prefix)
