"""What counts as activation memory, and a meter that measures it while a model runs.

"Saved-activation memory" is the bytes of the distinct storages that are kept alive for
backward: tensors autograd saves outside checkpoints, the inputs checkpoints keep, and
recomputed tensors waiting to be used by backward. Parameters (and views of them) are not
activations: they exist whether or not anything is checkpointed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ActivationMemoryMeter", "is_parameter_like", "storage_bytes", "active_meters"]


def is_parameter_like(t: torch.Tensor) -> bool:
    """A leaf that requires grad (a parameter, or an input the user differentiates) or a view of
    one: kept by its owner anyway, so not activation memory."""
    if t.requires_grad and t.is_leaf:
        return True
    base = t._base
    return base is not None and base.requires_grad and base.is_leaf


def _key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (parameter-like ones excluded)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if is_parameter_like(t) or t.device.type == "meta":
            continue
        seen[_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


_ACTIVE: list[ActivationMemoryMeter] = []


def active_meters() -> list[ActivationMemoryMeter]:
    """Meters currently measuring (checkpoint frames report recomputed tensors to them)."""
    return _ACTIVE


class _Tracked:
    """What the meter's pack hook stores: the tensor, counted until autograd drops it."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: torch.Tensor, meter: ActivationMemoryMeter, key: Any) -> None:
        self.tensor = tensor
        self.meter = meter
        self.key = key

    def __del__(self) -> None:
        if self.key is not None:
            self.meter.release(self.key)


class ActivationMemoryMeter:
    """Context manager measuring saved-activation memory (see the module docstring): the live
    bytes now (:attr:`current`) and the most seen at once (:attr:`peak`), both counting each
    storage once however many tensors share it.

    It installs a saved-tensor hook pair, so it sees what autograd keeps outside checkpoints
    and what checkpoints keep as inputs; checkpoint frames report their recomputed tensors to
    it while those wait for backward. Use it around forward *and* backward::

        with ActivationMemoryMeter() as meter:
            model(x).sum().backward()
        print(meter.peak)
    """

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self._counts: dict[Any, list[int]] = {}
        self._lock = threading.Lock()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> ActivationMemoryMeter:
        _ACTIVE.append(self)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        _ACTIVE.remove(self)

    def hold(self, t: torch.Tensor) -> Any:
        """Count ``t`` as kept; returns the key to pass to :meth:`release` (``None``: not an
        activation, nothing counted)."""
        if is_parameter_like(t) or t.device.type == "meta":
            return None
        key = _key(t)
        with self._lock:
            entry = self._counts.get(key)
            if entry is None:
                self._counts[key] = [1, t.untyped_storage().nbytes()]
                self.current += self._counts[key][1]
                self.peak = max(self.peak, self.current)
            else:
                entry[0] += 1
        return key

    def release(self, key: Any) -> None:
        """Undo one :meth:`hold`."""
        with self._lock:
            entry = self._counts.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] == 0:
                self.current -= entry[1]
                del self._counts[key]

    def _pack(self, t: torch.Tensor) -> _Tracked:
        return _Tracked(t, self, self.hold(t))

    @staticmethod
    def _unpack(tracked: _Tracked) -> torch.Tensor:
        return tracked.tensor
