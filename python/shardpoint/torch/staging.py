"""Staging of torch tensors for asynchronous saves, including tensors on a CUDA device.

CPU tensors are viewed as numpy arrays (no copy) and staged like any array
(:class:`shardpoint.storage.async_save.StagingBuffers`: parallel copy, GIL released). Device tensors are
copied into *pinned* host buffers, kept and reused from save to save, with ``non_blocking=True``
copies on a side stream:

1. the side stream first waits for the current stream, so the copy sees every write the
   training loop enqueued before the save call;
2. the copies run on the side stream and an event is recorded after them;
3. the current stream then waits for the side stream, so kernels the loop enqueues *after* the
   save call (an optimizer step updating the weights in place) cannot overwrite a tensor before
   its copy has read it: the snapshot holds, while the CPU thread returns at once;
4. the background writer waits on the event before it reads the pinned buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..storage.async_save import StagingBuffers
from .codec import format_dtype

__all__ = ["TorchStagingBuffers", "is_device_tensor"]


def is_device_tensor(value: Any) -> bool:
    """A dense tensor whose memory is on an accelerator (copied through pinned memory)."""
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.device.type not in ("cpu", "meta")
    )


class TorchStagingBuffers(StagingBuffers):
    """Staging buffers plus pinned host buffers for device tensors (one per key, reused)."""

    def __init__(self) -> None:
        super().__init__()
        self._pinned: dict[str, torch.Tensor] = {}
        self._streams: dict[torch.device, Any] = {}

    def _pinned_buffer(self, key: str, nbytes: int) -> torch.Tensor:
        b = self._pinned.get(key)
        if b is None or b.numel() != nbytes:
            b = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            self._pinned[key] = b
            self.allocations += 1
        return b

    def stage_devices(
        self, tensors: Mapping[str, torch.Tensor]
    ) -> tuple[list[tuple[str, str, str, tuple[int, ...], np.ndarray]], Callable[[], None]]:
        """Start non-blocking copies of device ``tensors`` into pinned buffers. Returns the
        encoded items (viewing the pinned memory) and the function that waits for the copies;
        the background writer calls it before reading the items."""
        for k in [k for k in self._pinned if k not in tensors]:
            del self._pinned[k]
        items = []
        events: list[Any] = []
        by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        for key, t in tensors.items():
            by_device.setdefault(t.device, []).append((key, t.detach()))
        for device, group in by_device.items():
            if device.type != "cuda":  # other accelerators: a plain synchronous copy
                for key, t in group:
                    host = t.cpu().contiguous()
                    buf = self._pinned_buffer(key, host.numel() * host.element_size())
                    buf.view(host.dtype).view(host.shape).copy_(host)
                    items.append(_item(key, t, buf))
                continue
            side = self._streams.get(device)
            if side is None:
                side = self._streams[device] = torch.cuda.Stream(device)
            current = torch.cuda.current_stream(device)
            side.wait_stream(current)  # (1) see everything enqueued before the save call
            with torch.cuda.stream(side):
                for key, t in group:
                    buf = self._pinned_buffer(key, t.numel() * t.element_size())
                    buf.view(t.dtype).view(t.shape).copy_(t, non_blocking=True)  # (2)
                    t.record_stream(side)  # the caching allocator must not reuse it early
                    items.append(_item(key, t, buf))
                ev = torch.cuda.Event()
                ev.record(side)
            current.wait_stream(side)  # (3) later in-place updates run after the copies
            events.append(ev)

        def ready() -> None:
            for ev in events:  # (4)
                ev.synchronize()

        return items, ready


def _item(
    key: str, t: torch.Tensor, buf: torch.Tensor
) -> tuple[str, str, str, tuple[int, ...], np.ndarray]:
    return key, format_dtype(t.dtype), "tensor", tuple(t.shape), buf.numpy()
