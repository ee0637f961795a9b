"""Tied weights: the names of a model's state dict that are one tensor, whether two values are
the same bits, the error when a checkpoint holds different values for them, and the strict-load
messages in torch's and in safetensors' wording. Shared by ``models.load_model`` and
``inplace.load_into`` (below both)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import CheckpointError

__all__ = [
    "IncompatibleKeys",
    "TiedWeightsConflictError",
    "same_values",
    "tied_conflict_message",
    "safetensors_keys_message",
    "torch_keys_message",
]


class TiedWeightsConflictError(CheckpointError, RuntimeError):
    """The checkpoint holds different values for names that are one tensor in the model (tied
    weights). A ``RuntimeError``, as ``safetensors.torch.load_model`` raises."""


class IncompatibleKeys(NamedTuple):
    """What :func:`load_model` returns: torch's ``load_state_dict`` result fields, which also
    unpack as safetensors' ``(missing, unexpected)`` pair."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _tied_groups(state: Mapping[str, Any]) -> list[list[str]]:
    """Names of the model's state dict that are the same tensor view (tied weights)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.numel() == 0:
            continue
        view = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype)
        groups.setdefault(view + (tuple(t.shape), tuple(t.stride())), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def same_values(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors (or two numpy arrays), dtype and shape included: the
    values a parameter would receive (NaNs with the same bits are equal, ``-0.0`` and ``0.0``
    are not)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        a_bytes = a.detach().contiguous().reshape(-1).view(torch.uint8)
        b_bytes = b.detach().to(a.device).contiguous().reshape(-1).view(torch.uint8)
        return bool(torch.equal(a_bytes, b_bytes))
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    return bool(np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)))


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{k}"' for k in names)


def safetensors_keys_message(
    model_name: str, missing: Sequence[str], unexpected: Sequence[str]
) -> str:
    """``safetensors.torch.load_model``'s strict-load message: each list sorted by name, on
    its own line indented by four spaces, no trailing full stop."""
    message = f"Error(s) in loading state_dict for {model_name}:"
    if missing:
        message += f"\n    Missing key(s) in state_dict: {_quoted(sorted(missing))}"
    if unexpected:
        message += f"\n    Unexpected key(s) in state_dict: {_quoted(sorted(unexpected))}"
    return message


def torch_keys_message(model_name: str, missing: Sequence[str], unexpected: Sequence[str]) -> str:
    """``Module.load_state_dict``'s strict-load message: the lists in the order given (torch:
    missing in the model's order, unexpected in the state dict's), tab-indented, each ending
    with ". "."""
    parts = []
    if missing:
        parts.append(f"Missing key(s) in state_dict: {_quoted(missing)}. ")
    if unexpected:
        parts.append(f"Unexpected key(s) in state_dict: {_quoted(unexpected)}. ")
    return "Error(s) in loading state_dict for {}:\n\t{}".format(model_name, "\n\t".join(parts))


def tied_conflict_message(
    model_name: str,
    conflicts: list[tuple[str, str]],
    missing: Sequence[str] = (),
    unexpected: Sequence[str] = (),
) -> str:
    """safetensors' strict-load message (the tied names stored with other values count as
    unexpected, as safetensors counts them) plus why."""
    extra = [other for _, other in conflicts]
    pairs = "; ".join(f'"{lead}" and "{other}"' for lead, other in conflicts)
    return (
        safetensors_keys_message(model_name, list(missing), list(unexpected) + extra)
        + f"\n    Tied weights: {pairs} are one tensor in the model but the checkpoint holds "
        "different values for them; keep one name in the checkpoint, untie the parameters, or "
        "pass strict=False to load the first name's value."
    )
