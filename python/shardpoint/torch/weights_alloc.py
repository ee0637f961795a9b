"""The tensors ``weights_iterator`` reads values into: each its own allocation (a new tensor,
or a mapping of its own out of the iterator's :class:`~.host_pool.HostPool`, placed for the
cold-read engine), with the same memory as a flat ``uint8`` array for the reads to land in."""

from __future__ import annotations

import numpy as np
import torch

from .. import storage
from .codec import torch_dtype
from .host_pool import HostPool

__all__ = ["PAGE", "own_tensor", "pooled_tensor"]

#: The file-offset alignment the direct engine reads in place at.
PAGE = 4096

#: dtypes ``torch.empty`` refuses in deterministic mode (float4: no fill for it), made through
#: bytes instead; found on first refusal.
_BY_BYTES: set[torch.dtype] = set()


def own_tensor(info: storage.EntryInfo, pin: bool) -> tuple[torch.Tensor, np.ndarray]:
    """A new tensor for ``info``'s value, its own allocation, and that allocation as a flat
    ``uint8`` array (the bytes the reads land in).

    Made as itself, not as a view of another tensor: torch keeps a view's base's Python
    object alive with it, so each value held ahead of the consumer was two objects for
    Python's collector, and with 20,000 small values held the full collections this caused
    were half the iterator's time (docs/SERVING.md, "Issue 41 (twenty-fourth round)").

    Unpinned, the memory is a numpy array's and the tensor is made over it with
    ``torch.frombuffer`` (as ``safetensors.torch.load`` makes its tensors) and given its shape
    in place (``resize_`` to the same size: no view, no second object): ~1.5 us a value,
    where ``torch.empty`` and the byte view the read needs (a tensor view, then its array)
    took ~3 us (docs/SERVING.md, "Issue 41 (twenty-fifth round)"). Such a tensor's storage
    cannot grow (``resize_`` to more elements raises), as ``torch.from_numpy``'s cannot."""
    dtype = torch_dtype(info.dtype)
    if not pin and info.raw_bytes:
        flat = np.empty(info.raw_bytes, np.uint8)
        t = torch.frombuffer(flat, dtype=dtype)
        if len(info.shape) != 1:
            t.resize_(info.shape)
        return t, flat
    if dtype not in _BY_BYTES:
        try:
            t = torch.empty(info.shape, dtype=dtype, pin_memory=pin)
        except NotImplementedError:  # deterministic mode's fill of a dtype it cannot fill
            _BY_BYTES.add(dtype)
        else:
            return t, (t if t.dim() else t.reshape(1)).view(torch.uint8).numpy().reshape(-1)
    raw = torch.empty(info.raw_bytes, dtype=torch.uint8, pin_memory=pin)
    return raw.view(dtype).view(info.shape), raw.numpy()


def pooled_tensor(
    info: storage.EntryInfo, pool: HostPool, unit: int = 0
) -> tuple[torch.Tensor, np.ndarray]:
    """A new tensor for ``info``'s value in a mapping of its own out of ``pool`` (recycled
    from a tensor the consumer has dropped, when one of its size is free), placed at its file
    offset's place in a ``unit`` (:data:`PAGE`: the direct engine reads it in place; ``LINE``:
    the kernel copies it out of the page cache) when that offset is a multiple of its element
    size (a tensor handed out is always aligned to its element size), else at the start; and
    its bytes as a flat ``uint8`` array, as :func:`own_tensor`."""
    dtype = torch_dtype(info.dtype)
    lead = info.offset % unit if unit and info.offset % dtype.itemsize == 0 else 0
    raw = pool.tensor(info.raw_bytes, lead)
    return raw.view(dtype).view(info.shape), raw.numpy()
