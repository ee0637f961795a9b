"""Where a DCP save given a path puts its checkpoint, and where a load finds it.

A ``shardpoint.torch.StorageWriter`` path is a checkpoint prefix (``P.index``, ``P.data-*``).
DCP's ``FileSystemWriter`` is given a directory instead, often a fresh ``tempfile.mkdtemp()``:
such an existing directory gets the checkpoint inside it, ``DIR/checkpoint``.
"""

from __future__ import annotations

import os

from .. import storage

#: the checkpoint's name inside a directory given as the path (``DIR/checkpoint.index``)
DIRECTORY_CHECKPOINT = "checkpoint"


def _in_directory(path: str) -> bool:
    """Whether ``path`` names an existing local directory that is not the hashed-prefix
    directory ``P/`` beside a checkpoint's ``P.index`` (FORMAT.md §3.1.1)."""
    return not storage.is_url(path) and os.path.isdir(path) and not os.path.exists(path + ".index")


def writer_prefix(path: str) -> str:
    """The prefix a save to ``path`` writes. An existing directory (what DCP's
    ``FileSystemWriter`` is given, often a fresh ``tempfile.mkdtemp()``) gets the checkpoint
    inside it, ``DIR/checkpoint``: taken as a prefix, the files would land beside the directory
    (``DIR.index``, outside a temporary directory's cleanup) and the commit, which removes an
    empty ``P/`` as a hashed-prefix leftover, would delete the user's empty directory."""
    return os.path.join(path, DIRECTORY_CHECKPOINT) if _in_directory(path) else path


def reader_prefix(path: str) -> str:
    """The prefix a load from ``path`` reads: ``DIR/checkpoint`` when ``path`` is a directory
    a save to ``DIR`` wrote (:func:`writer_prefix`), else ``path`` (``sp.open`` of a directory
    holding one checkpoint opens that one)."""
    if _in_directory(path):
        inside = os.path.join(path, DIRECTORY_CHECKPOINT)
        if os.path.exists(inside + ".index"):
            return inside
    return path
