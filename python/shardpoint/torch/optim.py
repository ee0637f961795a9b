"""``torch.optim.Optimizer`` as a trackable with TensorFlow-style slot variables.

Per-parameter tensor state (Adam's ``exp_avg``, ``exp_avg_sq`` and its per-parameter ``step``,
SGD's ``momentum_buffer``...) is saved as slot variables of the parameter it belongs to::

    model/l1/weight/.OPTIMIZER_SLOT/optimizer/exp_avg/.ATTRIBUTES/VARIABLE_VALUE

so it follows the parameter, not the optimizer's parameter numbering. The optimizer's own node
holds ``param_groups`` (hyperparameters per group, JSON) and ``param_scalars`` (non-tensor
per-parameter state such as a Python ``int`` step, by parameter position).

Restore works into a fresh optimizer (no state yet: slots are created from the checkpoint,
on the parameter's device, ``step`` kept where torch keeps it), into one that has already
stepped (state tensors are overwritten in place), and whether the optimizer is attached to the
checkpoint before or after ``restore()`` (deferred restore). Slots can only be saved for
parameters reachable from the checkpoint's root: unlike TensorFlow, which drops the others
silently, a save whose optimizer holds state for an unreachable parameter raises
``UnsaveableObjectError`` before anything is written (save the model with the optimizer, or
wrap the optimizer in ``TorchStateDictTrackable`` to save its ``state_dict()`` on its own).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from ..objgraph.errors import UnsaveableObjectError
from ..objgraph.trackable import Trackable, ValueSpec, as_trackable
from .codec import format_dtype, numpy_to_tensor, torch_dtype

__all__ = ["OptimizerAdapter", "PARAM_GROUPS", "PARAM_SCALARS"]

PARAM_GROUPS = "param_groups"
PARAM_SCALARS = "param_scalars"
_SCALARS = (int, float, bool, str, type(None))


def _encode_hyper(value: Any) -> Any:
    """JSON form of one hyperparameter (tensors and tuples tagged so they come back as such)."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": format_dtype(value.dtype)}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_hyper(v) for v in value]}
    if isinstance(value, list):
        return [_encode_hyper(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    if isinstance(value, _SCALARS):
        return value
    raise UnsaveableObjectError(
        f"optimizer hyperparameter of type {type(value).__name__} cannot be saved as JSON"
    )


def _decode_hyper(value: Any) -> Any:
    if isinstance(value, dict):
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=torch_dtype(value["dtype"]))
        if "__tuple__" in value:
            return tuple(_decode_hyper(v) for v in value["__tuple__"])
        if "__float__" in value:
            return float(value["__float__"])
    if isinstance(value, list):
        return [_decode_hyper(v) for v in value]
    return value


class OptimizerAdapter(Trackable):
    """Trackable view of a ``torch.optim.Optimizer`` (slot protocol + hyperparameters)."""

    _sp_open_attributes = False
    # per-parameter state is part of the optimizer's state: a save that cannot place a slot
    # under its parameter raises instead of dropping it (see naming._add_slots)
    _sp_slots_required = True

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        # (id(param), slot) -> adapter of the current state tensor. Held strongly: the restore
        # machinery binds slot objects weakly, and load-status checks walk the live graph later
        # and must find the same adapter objects.
        self._slot_adapters: dict[tuple[int, str], Trackable] = {}

    @property
    def name(self) -> str:
        return type(self.optimizer).__name__

    def __repr__(self) -> str:
        return f"<OptimizerAdapter {type(self.optimizer).__name__}>"

    # -- parameters ------------------------------------------------------------------------------
    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _group_of(self, param: torch.Tensor) -> Mapping[str, Any] | None:
        for group in self.optimizer.param_groups:
            if any(p is param for p in group["params"]):
                return group
        return None

    def _sp_describe_variable(self, variable: Any) -> str:
        """How a save error names a parameter: its position in the optimizer and its shape."""
        param = getattr(variable, "tensor", variable)
        for i, p in enumerate(self._params()):
            if p is param:
                return f"parameter {i} of shape {tuple(p.shape)}"
        return f"a tensor of shape {tuple(getattr(param, 'shape', ()))}"

    # -- values: hyperparameters and non-tensor per-parameter state --------------------------------
    def _sp_check_saveable(self) -> None:
        for i, p in enumerate(self._params()):
            for key, value in self.optimizer.state.get(p, {}).items():
                if not isinstance(value, (torch.Tensor, *_SCALARS)):
                    raise UnsaveableObjectError(
                        f"{type(self.optimizer).__name__} state {key!r} of parameter {i} is a "
                        f"{type(value).__name__}; only tensors and plain scalars can be saved "
                        "as optimizer slots. Wrap the optimizer in "
                        "shardpoint.torch.TorchStateDictTrackable to save its state_dict() "
                        "instead."
                    )

    def _sp_values(self) -> Mapping[str, Any]:
        groups = []
        for group in self.optimizer.param_groups:
            entry = {k: _encode_hyper(v) for k, v in group.items() if k != "params"}
            entry["__n_params__"] = len(group["params"])
            groups.append(entry)
        scalars: dict[str, dict[str, Any]] = {}
        for i, p in enumerate(self._params()):
            plain = {
                k: _encode_hyper(v)
                for k, v in self.optimizer.state.get(p, {}).items()
                if not isinstance(v, torch.Tensor)
            }
            if plain:
                scalars[str(i)] = plain
        return {PARAM_GROUPS: groups, PARAM_SCALARS: scalars}

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        return {PARAM_GROUPS: None, PARAM_SCALARS: None}

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        groups = values.get(PARAM_GROUPS)
        if groups is not None:
            live = self.optimizer.param_groups
            shape = [len(g["params"]) for g in live]
            saved = [g.get("__n_params__") for g in groups]
            if shape != saved:
                raise ValueError(
                    f"{type(self.optimizer).__name__}: the checkpoint has parameter groups of "
                    f"sizes {saved}, the live optimizer {shape}"
                )
            for group, stored in zip(live, groups, strict=True):
                for key, raw in stored.items():
                    if key == "__n_params__":
                        continue
                    value = _decode_hyper(raw)
                    current = group.get(key)
                    if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
                        with torch.no_grad():
                            current.copy_(value)  # keep capturable/device placement
                    else:
                        group[key] = value
        scalars = values.get(PARAM_SCALARS)
        if scalars:
            params = self._params()
            for index, entries in scalars.items():
                param = params[int(index)]
                for key, raw in entries.items():
                    self.optimizer.state[param][key] = _decode_hyper(raw)

    # -- slot protocol -----------------------------------------------------------------------------
    def _hold(self, param: torch.Tensor, slot_name: str, value: torch.Tensor) -> Trackable:
        adapter = as_trackable(value)
        if adapter is None:  # pragma: no cover - tensors always have an adapter once registered
            raise TypeError("torch tensors are not trackable: shardpoint.torch adapters missing")
        self._slot_adapters[(id(param), slot_name)] = adapter
        return adapter

    def _sp_slot_variables(self) -> Iterable[tuple[Any, str, Any]]:
        out = []
        for p in self._params():
            for key, value in self.optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    out.append((p, key, self._hold(p, key, value)))
        return out

    def _sp_get_slot(self, variable: Any, slot_name: str) -> Any:
        param = getattr(variable, "tensor", variable)
        if self._group_of(param) is None:
            return None
        state = self.optimizer.state.get(param)
        if not state:
            return None
        value = state.get(slot_name)
        return self._hold(param, slot_name, value) if isinstance(value, torch.Tensor) else None

    def _sp_create_slot(self, variable: Any, slot_name: str, value: Any) -> Any:
        """Restore-on-create: a fresh optimizer gets its state from the checkpointed value."""
        param = getattr(variable, "tensor", variable)
        group = self._group_of(param)
        if group is None or not isinstance(param, torch.Tensor):
            return None
        tensor = numpy_to_tensor(np.array(value))
        # torch's own rule (Optimizer.load_state_dict): "step" stays on the CPU unless the
        # group is capturable/fused; everything else follows the parameter's device
        if slot_name != "step" or group.get("capturable") or group.get("fused"):
            tensor = tensor.to(param.device)
        self.optimizer.state[param][slot_name] = tensor
        return self._hold(param, slot_name, tensor)
