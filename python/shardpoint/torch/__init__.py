"""PyTorch integration: tensors and state dicts, trackable adapters, DCP storage, multi-rank saves.

``import shardpoint`` never imports torch; ``import shardpoint.torch`` does (and fails with an
ImportError naming the ``shardpoint[torch]`` extra when PyTorch is missing). Importing it also
registers the trackable adapters, so ``sp.Checkpoint(model=net, optimizer=opt)`` works on plain
PyTorch objects. The ``torch.distributed`` parts (:class:`StorageWriter`, :class:`StorageReader`,
:class:`SavePlanner`, :func:`save_distributed`) are imported on first use, because ``torch.distributed.checkpoint`` is
slow to import. See docs/TORCH.md.
"""

from __future__ import annotations

from typing import Any

try:
    import torch as _torch  # noqa: F401 - fail early with a clear message
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "shardpoint.torch needs PyTorch; install it with `pip install 'shardpoint[torch]'` "
        "(or install torch yourself)"
    ) from exc

from . import adapters as _adapters
from . import objects as _objects
from .adapters import (
    ModuleAdapter,
    TensorAdapter,
    TorchStateDictTrackable,
    run_deferred_restores,
)
from .inplace import load_into
from .models import IncompatibleKeys, TiedWeightsConflictError, load_model, save_model
from .optim import OptimizerAdapter
from .state_checkpoint import StateDictCheckpoint
from .tensors import format_dtype, load, numpy_to_tensor, save, tensor_to_numpy, torch_dtype
from .weights import WeightsIterator, weights_iterator

__all__ = [
    "StateDictCheckpoint",
    "save",
    "load",
    "save_model",
    "load_model",
    "load_into",
    "weights_iterator",
    "WeightsIterator",
    "IncompatibleKeys",
    "TiedWeightsConflictError",
    "tensor_to_numpy",
    "numpy_to_tensor",
    "format_dtype",
    "torch_dtype",
    "TensorAdapter",
    "ModuleAdapter",
    "OptimizerAdapter",
    "TorchStateDictTrackable",
    "run_deferred_restores",
    "StorageWriter",
    "StorageReader",
    "save_distributed",
    "SavePlanner",
    "LoadPlanner",
    "on_one_rank",
    "latest_checkpoint",
    "gc",
    "share_listings",
]

_adapters.register()
_objects.register()

_LAZY = {
    "StorageWriter": "dcp",
    "StorageReader": "dcp",
    "save_distributed": "distributed",
    "SavePlanner": "dcp_planners",
    "LoadPlanner": "dcp_load_planner",
    "on_one_rank": "listing",
    "latest_checkpoint": "listing",
    "gc": "listing",
    "share_listings": "listing",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardpoint.torch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
