"""Global state a recompute must see exactly as the forward saw it.

Three pieces are captured right before the checkpointed forward and re-applied around the
recompute during backward:

* random number generators (:class:`RngSnapshot`): torch's CPU generator, the generators of the
  accelerator devices involved, numpy's global ``RandomState`` and Python's ``random`` module.
  The recompute runs on a *fork*: the states current at backward time are put back afterwards,
  so the global streams continue exactly where they would without checkpointing;
* autocast settings (:class:`AutocastState`);
* the default device set by a ``with torch.device(...)`` block (:class:`DeviceContext`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import torch

from ._common import ActivationCheckpointError, iter_tensors

__all__ = ["RngSnapshot", "AutocastState", "DeviceContext", "accelerator_types"]

# Device types that carry no random state of their own.
_NO_RNG_TYPES = frozenset({"cpu", "meta"})


def accelerator_types(tensors: Iterable[torch.Tensor]) -> dict[str, set[int]]:
    """Map each non-CPU device type used by ``tensors`` to the device indices it uses.

    ``cuda`` is always present (possibly with no index): the seed's rule stashes the *current*
    CUDA device even when no tensor argument lives there.
    """
    found: dict[str, set[int]] = {"cuda": set()}
    for t in tensors:
        dev = t.device
        if dev.type in _NO_RNG_TYPES:
            continue
        indices = found.setdefault(dev.type, set())
        if dev.index is not None:
            indices.add(dev.index)
    return found


def _device_module(device_type: str) -> ModuleType | None:
    """torch's module for an accelerator type if it exposes per-device RNG state."""
    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, "get_rng_state"):
        return None
    if not hasattr(module, "set_rng_state"):
        return None
    return module


def _is_initialized(module: ModuleType) -> bool:
    # Reading the state of an uninitialized runtime would initialize it (slow, and it may pick
    # a device the user did not want), so uninitialized runtimes are never touched.
    probe = getattr(module, "is_initialized", None)
    if callable(probe):
        return bool(probe())
    return bool(getattr(module, "_initialized", False))


class RngSnapshot:
    """Random state captured before a checkpointed forward (see the module docstring)."""

    __slots__ = ("_cpu", "_devices", "_numpy", "_python", "_uninitialized")

    def __init__(self, args: Iterable[Any]) -> None:
        tensors = [t for a in args for t in iter_tensors(a)]
        self._cpu = torch.get_rng_state()
        # (module, device index, state) for every accelerator generator we stash.
        self._devices: list[tuple[ModuleType, int, torch.Tensor]] = []
        # Runtimes that were not initialized: if the forward initializes one of them, its
        # state was never stashed and determinism cannot be promised (checked afterwards).
        self._uninitialized: list[tuple[str, ModuleType]] = []
        for device_type, indices in accelerator_types(tensors).items():
            module = _device_module(device_type)
            if module is None:
                continue
            if not _is_initialized(module):
                self._uninitialized.append((device_type, module))
                continue
            wanted = set(indices)
            current = getattr(module, "current_device", None)
            if callable(current):
                wanted.add(int(current()))
            for index in sorted(wanted):
                self._devices.append((module, index, module.get_rng_state(index)))
        self._numpy = np.random.get_state()
        self._python = random.getstate()

    def check_no_new_runtime(self) -> None:
        """Raise if the forward initialized an accelerator runtime whose RNG was not stashed
        (PyTorch raises the same error; its recompute could not reproduce the random draws)."""
        for device_type, module in self._uninitialized:
            if _is_initialized(module):
                raise ActivationCheckpointError(
                    f"The {device_type} runtime was initialized inside the forward pass of a "
                    "checkpoint with preserve_rng_state=True, so its random state could not be "
                    "stashed before the forward and the recompute would not reproduce it. "
                    f"Initialize {device_type} before the checkpoint (for example by creating a "
                    "tensor on it), move the tensors there before calling checkpoint, or pass "
                    "preserve_rng_state=False."
                )

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block with the captured states, then put back the states current on entry."""
        saved_cpu = torch.get_rng_state()
        saved_devices = [(m, i, m.get_rng_state(i)) for m, i, _ in self._devices]
        saved_numpy = np.random.get_state()
        saved_python = random.getstate()
        torch.set_rng_state(self._cpu)
        for module, index, state in self._devices:
            module.set_rng_state(state, index)
        np.random.set_state(self._numpy)
        random.setstate(self._python)
        try:
            yield
        finally:
            torch.set_rng_state(saved_cpu)
            for module, index, state in saved_devices:
                module.set_rng_state(state, index)
            np.random.set_state(saved_numpy)
            random.setstate(saved_python)


class AutocastState:
    """Autocast settings of the CPU and of every accelerator type involved, captured at forward.

    The recompute re-enters them, so a segment that ran under ``torch.autocast`` recomputes in
    the same dtypes even though backward itself runs outside the autocast block.
    """

    __slots__ = ("_settings", "_cache_enabled")

    def __init__(self, device_types: Iterable[str]) -> None:
        self._settings: list[tuple[str, bool, torch.dtype]] = []
        for device_type in sorted({"cpu", *device_types}):
            if not torch.amp.is_autocast_available(device_type):
                continue
            self._settings.append(
                (
                    device_type,
                    torch.is_autocast_enabled(device_type),
                    torch.get_autocast_dtype(device_type),
                )
            )
        self._cache_enabled = torch.is_autocast_cache_enabled()

    def enter(self, stack: contextlib.ExitStack) -> None:
        """Enter the captured autocast contexts on ``stack``."""
        for device_type, enabled, dtype in self._settings:
            stack.enter_context(
                torch.autocast(
                    device_type, dtype=dtype, enabled=enabled, cache_enabled=self._cache_enabled
                )
            )


class DeviceContext:
    """The default device of tensor factories (``with torch.device(...)``) at forward time."""

    __slots__ = ("_device",)

    def __init__(self) -> None:
        self._device = torch.get_default_device()

    def enter(self, stack: contextlib.ExitStack) -> None:
        """Re-apply the captured default device if backward runs under a different one."""
        if torch.get_default_device() != self._device:
            stack.enter_context(torch.device(self._device))
