"""``map_location`` as ``torch.load`` takes it: where loaded tensors go.

shardpoint stores host bytes; :func:`shardpoint.torch.save` records the device each
non-CPU tensor was saved from as its *location tag* (``"cuda:0"``, torch's tags; CPU tensors
have ``"cpu"``, the tag of every tensor of checkpoints that recorded none). Loading first builds
every tensor on the CPU, then places each storage (once, so tensors that share storage keep
sharing it) by torch's rules:

* ``None``: back to the device it was saved from;
* a ``str`` or ``torch.device``: every tensor there;
* a dict: location tag → tag or device (tags not in it keep their device);
* a callable ``fn(storage, location)``: called once per storage with the CPU
  ``UntypedStorage`` and its tag; a returned storage is used as is, ``None`` means the
  default placement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import torch

from ..errors import DeviceUnavailableError, InvalidArgumentError

__all__ = ["MapLocation", "saved_locations", "place"]

#: What ``map_location`` may be (torch's ``MAP_LOCATION``).
MapLocation: TypeAlias = (
    str
    | torch.device
    | Mapping[str, str | torch.device]
    | Callable[[torch.UntypedStorage, str], Any]
    | None
)


def saved_locations(flat: Mapping[str, Any]) -> dict[str, str]:
    """Location tags of the non-CPU tensors of a flat state dict (what :func:`place` reads)."""
    return {
        k: str(v.device)
        for k, v in flat.items()
        if isinstance(v, torch.Tensor) and v.device.type not in ("cpu", "meta")
    }


def is_plain_device(map_location: MapLocation) -> bool:
    """Whether ``map_location`` names one device for every tensor."""
    return isinstance(map_location, str | torch.device)


def _storage_to(storage: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
    whole = torch.empty(0, dtype=torch.uint8).set_(storage)
    return whole.to(device).untyped_storage()


def _as_untyped(value: Any, location: str) -> torch.UntypedStorage:
    if isinstance(value, torch.UntypedStorage):
        return value
    if isinstance(value, torch.TypedStorage):
        return value.untyped()
    raise InvalidArgumentError(
        f"map_location returned {type(value).__name__} for location {location!r}; "
        "expected a storage or None"
    )


def _target(
    storage: torch.UntypedStorage, location: str, map_location: MapLocation
) -> torch.UntypedStorage | None:
    """The placed storage, or None when it stays where it is (on the CPU)."""
    target: Any
    if map_location is None:
        target = location
    elif is_plain_device(map_location):
        target = map_location
    elif isinstance(map_location, Mapping):
        target = map_location.get(location, location)
    elif callable(map_location):
        got = map_location(storage, location)
        if got is not None:
            return _as_untyped(got, location)
        target = location
    else:
        raise InvalidArgumentError(
            "map_location must be None, a str, a torch.device, a dict or a callable, "
            f"got {type(map_location).__name__}"
        )
    dev = torch.device(target)
    if dev.type == "cpu":
        return None
    if dev.type == "cuda":
        _check_cuda(dev)
    return _storage_to(storage, dev)


def _check_cuda(dev: torch.device) -> None:
    """Refuse a CUDA device this process lacks in ``torch.load``'s words (its tests and its
    users match them); the caller adds which key and checkpoint."""
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() "
            "is False. If you are running on a CPU-only machine, please use torch.load with "
            "map_location=torch.device('cpu') to map your storages to the CPU."
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise DeviceUnavailableError(
            f"Attempting to deserialize object on CUDA device {dev.index} but "
            f"torch.cuda.device_count() is {count}. Please use torch.load with map_location "
            "to map your storages to an existing device."
        )


def place(out: dict[str, Any], locations: Mapping[str, str], map_location: MapLocation) -> None:
    """Move the CPU tensors of ``out`` (in place of its values) as ``map_location`` says.
    ``locations``: the saved location tag of each key (missing keys: ``"cpu"``)."""
    done: dict[tuple[int, int, str], torch.UntypedStorage | None] = {}
    for key, t in out.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            continue
        st = t.untyped_storage()
        loc = locations.get(key, "cpu")
        ident = (st.data_ptr(), st.nbytes(), loc)
        if ident not in done:
            try:
                done[ident] = _target(st, loc, map_location)
            except DeviceUnavailableError as e:
                raise DeviceUnavailableError(
                    f"{e} (shardpoint checkpoint: key {key!r}, saved on {loc!r}; "
                    "map_location='cpu' loads it on the CPU)"
                ) from None
            except (RuntimeError, AssertionError) as e:
                # also a RuntimeError, as what torch.load lets through from the same placement
                raise DeviceUnavailableError(
                    f"key {key!r} (saved on {loc!r}) cannot be placed as map_location="
                    f"{map_location!r} says: {e}. Pass map_location='cpu' (or a dict such as "
                    f"{{{loc!r}: 'cpu'}}) to load it elsewhere"
                ) from e
        placed = done[ident]
        if placed is None:
            continue
        view = torch.empty(0, dtype=t.dtype, device=placed.device)
        view.set_(placed, t.storage_offset(), t.size(), t.stride())
        out[key] = view
