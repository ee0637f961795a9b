"""Object-entry tags for torch's small value types (FORMAT.md §6.1): ``torch.Size``,
``torch.dtype`` and ``torch.device`` inside checkpoint objects (a dataclass field, a
hyper-parameter dict), described declaratively. Registered when ``shardpoint.torch`` is
imported; the storage layer imports this module itself when it meets such a value or tag
(``shardpoint/__init__`` declares it), so it never imports torch on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import UnsupportedDTypeError
from ..storage.objects import register_tag
from .codec import format_dtype, torch_dtype

__all__ = ["register"]

Child = Callable[[Any, str], Any]


def _encode_dtype(value: torch.dtype, child: Child) -> str:
    return format_dtype(value)


def _decode_dtype(payload: Any, child: Child) -> torch.dtype:
    if not isinstance(payload, str):
        raise ValueError("expected a dtype name")
    try:
        return torch_dtype(payload)
    except UnsupportedDTypeError:
        raise ValueError(f"unknown torch dtype {payload[:40]!r}") from None


def _decode_size(payload: Any, child: Child) -> torch.Size:
    if not (isinstance(payload, list) and all(type(n) is int and n >= 0 for n in payload)):
        raise ValueError("expected a list of non-negative ints")
    return torch.Size(payload)


def _decode_device(payload: Any, child: Child) -> torch.device:
    if not isinstance(payload, str) or len(payload) > 64:
        raise ValueError("expected a device string")
    try:
        return torch.device(payload)
    except RuntimeError as e:  # torch's parse error
        raise ValueError(str(e)) from None


def register() -> None:
    """Register the torch tags (idempotent)."""
    register_tag("torch.Size", (torch.Size,), lambda v, c: [int(n) for n in v], _decode_size)
    register_tag("torch.dtype", (torch.dtype,), _encode_dtype, _decode_dtype)
    register_tag("torch.device", (torch.device,), lambda v, c: str(v), _decode_device)


register()
