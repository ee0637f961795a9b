"""``save_model`` / ``load_model``: whole ``nn.Module`` state dicts with tied weights, as
``safetensors.torch`` offers them, with missing/unexpected keys reported as torch's
``load_state_dict`` reports them.

Tied weights need no special saving here (``save`` stores an exact alias once and records the
other name), so ``save_model`` is ``save`` of the model's state dict. ``load_model`` resolves
tied names the other way: a model name tied to a name found in the checkpoint is not missing,
so checkpoints that kept only one name of a tied group (safetensors' ``save_model`` output
converted with ``shardpoint convert``, or a hand-pruned state dict) load completely.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from .tensors import load, save

__all__ = ["save_model", "load_model", "IncompatibleKeys"]


class IncompatibleKeys(NamedTuple):
    """What :func:`load_model` returns: torch's ``load_state_dict`` result fields, which also
    unpack as safetensors' ``(missing, unexpected)`` pair."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def save_model(
    model: torch.nn.Module,
    prefix: str | os.PathLike[str],
    metadata: Mapping[str, Any] | None = None,
    force_contiguous: bool = True,
    **options: Any,
) -> None:
    """Save ``model.state_dict()`` as checkpoint ``prefix``; tied weights are stored once.

    Args:
        model: the module to save.
        prefix: checkpoint prefix (``prefix.index`` + ``prefix.data-*``).
        metadata: JSON-able mapping, read back exactly by ``sp.open(prefix).metadata``.
        force_contiguous: save each non-contiguous tensor as a contiguous copy (as
            safetensors); contiguous tensors, tied ones included, are saved as they are. With
            ``False`` views keep their layout (see docs/TORCH.md, shared storage).
        options: ``compression``, ``level``, ``shards``, ``durable``, ``chunk_bytes`` as
            :func:`shardpoint.torch.save`.
    """
    state = model.state_dict()
    if force_contiguous:
        state = type(state)((k, v.contiguous()) for k, v in state.items())
    save(state, prefix, metadata=metadata, **options)


def _tied_groups(state: Mapping[str, Any]) -> list[list[str]]:
    """Names of the model's state dict that are the same tensor view (tied weights)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.numel() == 0:
            continue
        view = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype)
        groups.setdefault(view + (tuple(t.shape), tuple(t.stride())), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def load_model(
    model: torch.nn.Module,
    prefix: str | os.PathLike[str],
    strict: bool = True,
    device: str | int | torch.device = "cpu",
) -> IncompatibleKeys:
    """Load checkpoint ``prefix`` into ``model`` (in place), resolving tied weights.

    Args:
        model: the module to load into.
        prefix: a checkpoint written by :func:`save_model` / :func:`save` (or any flat one).
        strict: raise ``RuntimeError`` when keys are missing or unexpected (torch's message).
        device: where the loaded tensors are placed before being copied into the model.

    Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``: model names the checkpoint
    did not provide (names tied to a provided one excepted), and checkpoint names the model
    does not have. Shape mismatches raise ``RuntimeError`` from ``load_state_dict`` itself.
    """
    dev = torch.device(f"cuda:{device}") if isinstance(device, int) else torch.device(device)
    loaded = load(prefix, dev)
    own = model.state_dict()
    state = dict(loaded)
    for group in _tied_groups(own):
        present = [n for n in group if n in state]
        for name in group:
            if name not in state and present:
                state[name] = state[present[0]]
    result = model.load_state_dict(state, strict=False)
    missing = list(result.missing_keys)
    unexpected = list(result.unexpected_keys)
    if strict and (missing or unexpected):
        msgs = []  # torch's order and wording (Module.load_state_dict)
        if missing:
            msgs.append(
                "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing))
            )
        if unexpected:
            msgs.append(
                "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)
                )
            )
        raise RuntimeError(
            "Error(s) in loading state_dict for {}:\n\t{}".format(
                model.__class__.__name__, "\n\t".join(msgs)
            )
        )
    return IncompatibleKeys(missing, unexpected)
