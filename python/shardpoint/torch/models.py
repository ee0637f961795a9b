"""``save_model`` / ``load_model``: whole ``nn.Module`` state dicts with tied weights, as
``safetensors.torch`` offers them, with missing/unexpected keys reported as
``safetensors.torch.load_model`` reports them (its message: names sorted, one line each).

Tied weights need no special saving here (``save`` stores an exact alias once and records the
other name), so ``save_model`` is ``save`` of the model's state dict. ``load_model`` resolves
tied names the other way: a model name tied to a name found in the checkpoint is not missing,
so checkpoints that kept only one name of a tied group (safetensors' ``save_model`` output
converted with ``shardpoint convert``, or a hand-pruned state dict) load completely. A
checkpoint that holds *different* values under two names of one tied group cannot be loaded
into it (one parameter, two values): like ``safetensors.torch.load_model`` it raises with
``strict=True`` (:class:`TiedWeightsConflictError`, a ``RuntimeError``), and with
``strict=False`` it reports the other names as unexpected and loads the first one; torch's
``load_state_dict`` silently keeps whichever it copies last. Equal values load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from .inplace import load_into_worded
from .tensors import load, save
from .tied import (
    IncompatibleKeys,
    TiedWeightsConflictError,
    _tied_groups,
    safetensors_keys_message,
    same_values,
    tied_conflict_message,
)

__all__ = ["save_model", "load_model", "IncompatibleKeys", "TiedWeightsConflictError"]


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


def _plain_cpu_module(model: torch.nn.Module) -> bool:
    """Whether loading ``model`` needs nothing of ``load_state_dict`` beyond writing each state
    tensor: every tensor on the CPU, no state-dict hooks, no ``_load_from_state_dict``
    override (quantised or sharded modules customise loading and keep the general path), no
    ``load_state_dict`` override on the module itself (it may rename or skip entries)."""
    if type(model).load_state_dict is not torch.nn.Module.load_state_dict:
        return False
    base = torch.nn.Module._load_from_state_dict
    for m in model.modules():
        if type(m)._load_from_state_dict is not base:
            return False
        for hooks in (
            "_load_state_dict_pre_hooks",
            "_load_state_dict_post_hooks",
            "_state_dict_hooks",
            "_state_dict_pre_hooks",
        ):
            if getattr(m, hooks, None):
                return False
    for t in model.state_dict().values():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return False
    return True


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
        strict: raise ``RuntimeError`` when keys are missing or unexpected, worded as
            ``safetensors.torch.load_model`` words it (names sorted).
        device: where the loaded tensors are placed before being copied into the model.

    Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``: model names the checkpoint
    did not provide (names tied to a provided one excepted), and checkpoint names the model
    does not have. Shape mismatches raise ``RuntimeError`` (torch's "size mismatch" wording).

    A CPU model whose modules do not customise loading (no state-dict hooks, no
    ``_load_from_state_dict`` override, no ``load_state_dict`` override on the model itself)
    is loaded with :func:`load_into`: values are decoded
    straight into its tensors, checksums checked, in parallel. Other models go through
    ``load`` + ``load_state_dict``.

    Raises:
        TiedWeightsConflictError: (``strict=True``) two names of one tied group hold different
            values in the checkpoint; nothing is loaded. With ``strict=False`` the first
            name's value is loaded and the others are returned as unexpected.
    """
    dev = torch.device(f"cuda:{device}") if isinstance(device, int) else torch.device(device)
    if dev.type == "cpu" and _plain_cpu_module(model):
        # The fast path: decode straight into the parameters (no fresh memory, no second
        # copy); the same missing/unexpected/size-mismatch rules and messages.
        return load_into_worded(model, prefix, strict=strict, keys_message=safetensors_keys_message)
    loaded = load(prefix, dev)
    own = model.state_dict()
    state = dict(loaded)
    conflicts: list[tuple[str, str]] = []
    for group in _tied_groups(own):
        present = [n for n in group if n in state]
        for name in group:
            if name not in state and present:
                state[name] = state[present[0]]
        for other in present[1:]:
            if state[other] is not state[present[0]] and not same_values(
                state[present[0]], state[other]
            ):
                conflicts.append((present[0], other))
                state[other] = state[present[0]]
    name = model.__class__.__name__
    if conflicts and strict:
        # nothing is loaded: the names alone say what is missing and unexpected
        missing = [n for n in own if n not in state]
        unexpected = [n for n in loaded if n not in own]
        raise TiedWeightsConflictError(tied_conflict_message(name, conflicts, missing, unexpected))
    result = model.load_state_dict(state, strict=False)
    missing = list(result.missing_keys)
    unexpected = list(result.unexpected_keys) + [other for _, other in conflicts]
    if strict and (missing or unexpected):
        raise RuntimeError(safetensors_keys_message(name, missing, unexpected))
    return IncompatibleKeys(missing, unexpected)
