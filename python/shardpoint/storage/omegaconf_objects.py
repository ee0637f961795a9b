"""Object-entry tags for OmegaConf configs (FORMAT.md §6.1): ``omegaconf.DictConfig`` and
``omegaconf.ListConfig`` are stored as their containers with interpolations unresolved
(``${...}`` strings stay strings) and rebuilt with ``OmegaConf.create``. Imported by the
storage layer only when a value of omegaconf's or a file's tag needs it (declared in
``shardpoint/__init__``); structured configs lose their dataclass schema (they come back as
plain configs holding the same values)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from .object_types import register_tag

__all__ = ["register"]

Child = Callable[[Any, str], Any]


def _encode(value: DictConfig | ListConfig, child: Child) -> Any:
    return child(OmegaConf.to_container(value, resolve=False, enum_to_str=False), "")


def _decode_dict(payload: Any, child: Child) -> DictConfig:
    value = child(payload, "")
    if not isinstance(value, dict):
        raise ValueError("a DictConfig holds a dict")
    return OmegaConf.create(value)


def _decode_list(payload: Any, child: Child) -> ListConfig:
    value = child(payload, "")
    if not isinstance(value, list):
        raise ValueError("a ListConfig holds a list")
    return OmegaConf.create(value)


def register() -> None:
    """Register the OmegaConf tags (idempotent)."""
    register_tag("omegaconf.DictConfig", (DictConfig,), _encode, _decode_dict)
    register_tag("omegaconf.ListConfig", (ListConfig,), _encode, _decode_list)


register()
