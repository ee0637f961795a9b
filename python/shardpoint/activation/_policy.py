"""``policy=``: selective activation checkpointing in one argument.

PyTorch's way is ``context_fn=functools.partial(create_selective_checkpoint_contexts,
policy_fn_or_op_list)``; ``checkpoint`` accepts exactly that. ``policy=`` builds it for the
common cases:

* ``"matmul"``: save the outputs of matrix multiplications, convolutions and attention kernels
  (expensive to recompute, one output each), recompute everything else (pointwise ops,
  normalizations: cheap, and often several tensors each);
* a list of ops: ``torch.ops.aten.mm`` (an overload packet: all its overloads) or
  ``torch.ops.aten.mm.default``, saved; everything else recomputed;
* a callable ``(ctx, op, *args, **kwargs) -> bool | CheckpointPolicy``, as PyTorch's policy
  functions (``True`` means save).

The caching is PyTorch's own (``torch.utils.checkpoint.create_selective_checkpoint_contexts``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts

__all__ = ["policy_context_fn", "MATMUL_OPS"]

_MATMUL_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward",
    "_flash_attention_forward",
)


def _overloads(packet: Any) -> list[Any]:
    return [getattr(packet, name) for name in packet.overloads()]


def _matmul_ops() -> list[Any]:
    ops = []
    for name in _MATMUL_NAMES:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.extend(_overloads(packet))
    return ops


MATMUL_OPS: tuple[Any, ...] = tuple(_matmul_ops())


def policy_context_fn(policy: Any) -> Callable[[], tuple[Any, Any]]:
    """The ``context_fn`` implementing ``policy`` (see the module docstring)."""
    if isinstance(policy, str):
        if policy != "matmul":
            raise ValueError(
                f"policy must be 'matmul', a list of ops or a callable, got {policy!r}"
            )
        ops = list(MATMUL_OPS)
        return functools.partial(create_selective_checkpoint_contexts, ops)
    if isinstance(policy, (list, tuple, set, frozenset)):
        ops = []
        for op in policy:
            if isinstance(op, torch._ops.OpOverloadPacket):
                ops.extend(_overloads(op))
            elif isinstance(op, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
                ops.append(op)
            else:
                raise ValueError(
                    f"policy: expected torch ops such as torch.ops.aten.mm or "
                    f"torch.ops.aten.mm.default, got {op!r} of type {type(op).__name__}"
                )
        return functools.partial(create_selective_checkpoint_contexts, ops)
    if callable(policy):
        return functools.partial(create_selective_checkpoint_contexts, policy)
    raise TypeError(f"policy must be 'matmul', a list of ops or a callable, got {policy!r}")
