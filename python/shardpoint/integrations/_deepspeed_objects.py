"""DeepSpeed's Python objects in its checkpoints, as tagged plain entries (never pickled).

DeepSpeed's state holds a few Python objects besides tensors and plain values (the loss
scaler, the ZeRO stage enum, ``fragment_address`` records, a set of module names): they are
stored as tagged plain entries from an allow-list (:data:`OBJECT_TYPES`) and rebuilt on load;
anything else is refused at save time by the storage layer, naming the entry. Shared by the
checkpoint engine (writing, resuming) and the consolidation (:mod:`.zero_to_fp32`).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Mapping
from typing import Any

from ..errors import CorruptCheckpointError

__all__ = ["OBJECT_TYPES", "encode_objects", "decode_objects"]

_TAG = "__shardpoint_object__"

#: the Python objects of DeepSpeed checkpoints stored as tagged entries: name -> (module, class)
OBJECT_TYPES = {
    "ZeroStageEnum": ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    "fragment_address": ("deepspeed.utils.tensor_fragment", "fragment_address"),
    "LossScaler": ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    "DynamicLossScaler": ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
}


def _known(obj: Any) -> str | None:
    for name, (module, cls) in OBJECT_TYPES.items():
        if type(obj).__name__ == cls and type(obj).__module__ == module:
            return name
    return None


def encode_objects(tree: Any, path: str = "") -> Any:
    """``tree`` with the allow-listed DeepSpeed objects (and sets) as tagged dicts."""
    if isinstance(tree, Mapping):
        return {k: encode_objects(v, f"{path}/{k}") for k, v in tree.items()}
    if isinstance(tree, list):
        return [encode_objects(v, f"{path}/{i}") for i, v in enumerate(tree)]
    if type(tree) is tuple:
        # plain tuples only: a tuple subclass (torch.Size in param_shapes, a namedtuple) is
        # kept as itself for the storage layer's own tags; rebuilding it as a tuple loses
        # its type (DeepSpeed's ZeRO-3 merge calls shape.numel())
        return tuple(encode_objects(v, f"{path}/{i}") for i, v in enumerate(tree))
    if isinstance(tree, set | frozenset):
        return {_TAG: "set", "items": sorted(tree, key=repr)}
    name = _known(tree)
    if name is None:
        return tree
    if isinstance(tree, enum.Enum):
        return {_TAG: name, "value": tree.value}
    if dataclasses.is_dataclass(tree):
        fields = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
        return {_TAG: name, "fields": encode_objects(fields, path)}
    return {_TAG: name, "attributes": encode_objects(dict(vars(tree)), path)}


def decode_objects(tree: Any, path: str = "") -> Any:
    """Inverse of :func:`encode_objects`: builds only allow-listed classes."""
    if isinstance(tree, Mapping):
        if _TAG not in tree:
            return {k: decode_objects(v, f"{path}/{k}") for k, v in tree.items()}
        name = tree[_TAG]
        if name == "set":
            return set(tree["items"])
        if name not in OBJECT_TYPES:
            raise CorruptCheckpointError(
                f"deepspeed: entry {path or '/'!r} names object type {name!r}, which is not in "
                f"the allow-list {sorted(OBJECT_TYPES)}"
            )
        module, cls_name = OBJECT_TYPES[name]
        cls = getattr(importlib.import_module(module), cls_name)
        if "value" in tree:
            return cls(tree["value"])
        if "fields" in tree:
            return cls(**decode_objects(tree["fields"], path))
        obj = cls.__new__(cls)
        obj.__dict__.update(decode_objects(tree["attributes"], path))
        return obj
    if isinstance(tree, list):
        return [decode_objects(v, f"{path}/{i}") for i, v in enumerate(tree)]
    if type(tree) is tuple:  # not torch.Size (see encode_objects)
        return tuple(decode_objects(v, f"{path}/{i}") for i, v in enumerate(tree))
    return tree
