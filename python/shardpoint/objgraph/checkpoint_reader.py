"""Inspect checkpoints: ``load_checkpoint``, ``list_variables``, ``load_variable``."""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingKeyError, NotFoundError
from . import storage_io
from .checkpoint_state import latest_checkpoint

__all__ = ["CheckpointReader", "load_checkpoint", "list_variables", "load_variable"]


def _resolve(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    # `P/` of a checkpoint saved with hashed_prefixes=True is a directory beside `P.index`
    # (FORMAT.md §3.1.1): the index says it is a prefix
    if os.path.isdir(path) and not os.path.isfile(path.rstrip("/") + ".index"):
        latest = latest_checkpoint(path)
        if latest is None:
            raise ValueError(
                f"Couldn't find 'checkpoint' file or checkpoints in given directory {path}"
            )
        return latest
    return path


def _strip(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


class CheckpointReader:
    """Read-only view of one checkpoint (values are read lazily, key by key)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        try:
            self._reader = storage_io.open_reader(prefix)
        except FileNotFoundError as exc:
            raise NotFoundError(
                f"No checkpoint found at {prefix} ({prefix}.index does not exist)."
            ) from exc

    def keys(self) -> list[str]:
        return list(self._reader.keys())

    def has_tensor(self, name: str) -> bool:
        return _strip(name) in self._reader

    def get_tensor(self, name: str) -> Any:
        """The value of ``name`` (a trailing ``:0`` is ignored); bytes for the object graph."""
        key = _strip(name)
        if key not in self._reader:
            raise MissingKeyError(f"Key {key} not found in checkpoint {self.prefix}")
        return self._reader[key]

    def get_variable_to_shape_map(self) -> dict[str, list[int]]:
        """``key -> shape``; typed (non-tensor) values such as the object graph are scalars."""
        out = {}
        for key in self._reader.keys():
            info = self._reader.info(key)
            out[key] = list(info.shape) if info.kind == "tensor" else []
        return out

    def get_variable_to_dtype_map(self) -> dict[str, str]:
        """``key -> dtype name``; typed values report their kind (bytes, str, int, json...)."""
        out = {}
        for key in self._reader.keys():
            info = self._reader.info(key)
            out[key] = str(info.dtype) if info.kind == "tensor" else str(info.kind)
        return out

    def close(self) -> None:
        close = getattr(self._reader, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_checkpoint(ckpt_dir_or_file: str | os.PathLike) -> CheckpointReader:
    """Reader for a checkpoint prefix, or for the latest checkpoint of a directory."""
    return CheckpointReader(_resolve(ckpt_dir_or_file))


def list_variables(ckpt_dir_or_file: str | os.PathLike) -> list[tuple[str, list[int]]]:
    """``(key, shape)`` for every entry, sorted by key (the object graph entry included)."""
    with load_checkpoint(ckpt_dir_or_file) as reader:
        shapes = reader.get_variable_to_shape_map()
    return sorted(shapes.items())


def load_variable(ckpt_dir_or_file: str | os.PathLike, name: str) -> Any:
    """The value stored under ``name`` (a trailing ``:0`` is ignored)."""
    with load_checkpoint(ckpt_dir_or_file) as reader:
        value = reader.get_tensor(name)
        return value.copy() if hasattr(value, "copy") else value
