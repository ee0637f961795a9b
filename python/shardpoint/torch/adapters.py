"""Trackable adapters: plain PyTorch objects in ``sp.Checkpoint`` object graphs.

* :class:`TensorAdapter` — a tensor or ``nn.Parameter`` is a variable (``VARIABLE_VALUE``);
  restore copies into the existing tensor in place (``torch.no_grad(); t.copy_(...)``), so
  optimizers and modules holding it see the restored value.
* :class:`ModuleAdapter` — an ``nn.Module``'s parameters, persistent buffers and child modules
  are its dependencies, named by attribute (``model/l1/weight/.ATTRIBUTES/VARIABLE_VALUE``).
  Lazy modules: a parameter that is not materialized yet is "missing", so the restore parks it
  in the deferred queue; a forward pre-hook (registered after the lazy module's own
  initialization hook) restores it right after it materializes, before the forward runs.
* :class:`TorchStateDictTrackable` — anything else with ``state_dict()``/``load_state_dict()``
  (LR schedulers, ``GradScaler``, stateful data loaders): the built-in state-dict adapter, plus
  a record of which leaves were tensors so they come back as tensors.

Optimizers are in :mod:`.optim`. :func:`register` installs all of them (done on import of
``shardpoint.torch``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn.parameter import is_lazy

from ..objgraph.errors import UnsaveableObjectError
from ..objgraph.state_dict_adapter import STRUCTURE_ATTRIBUTE, StateDictTrackable
from ..objgraph.trackable import Trackable, ValueSpec, as_trackable, register_builtin_adapter
from ..objgraph.variables import VARIABLE_VALUE
from ..storage.objects import has_handler
from .codec import format_dtype, numpy_to_tensor, tensor_to_numpy, unflatten

__all__ = [
    "TensorAdapter",
    "ModuleAdapter",
    "TorchStateDictTrackable",
    "TENSORS_ATTRIBUTE",
    "register",
    "run_deferred_restores",
]

#: attribute listing the state-dict leaves that were tensors (present only when some were)
TENSORS_ATTRIBUTE = ".TORCH_TENSORS"


def copy_into(tensor: torch.Tensor, value: Any) -> None:
    """Copy a restored (numpy) value into ``tensor`` in place, on the tensor's device."""
    src = numpy_to_tensor(np.asarray(value))
    with torch.no_grad():
        tensor.copy_(src)


class TensorAdapter(Trackable):
    """A torch tensor (or ``nn.Parameter``) as a variable with one value, restored in place."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    @property
    def name(self) -> str:
        return ""

    def __repr__(self) -> str:
        t = self.tensor
        if is_lazy(t):
            return f"<TensorAdapter uninitialized {type(t).__name__}>"
        return f"<TensorAdapter {type(t).__name__} shape={tuple(t.shape)} dtype={t.dtype}>"

    def _sp_check_saveable(self) -> None:
        if is_lazy(self.tensor):
            raise UnsaveableObjectError(
                "an uninitialized lazy parameter has no value to save; run a forward pass first"
            )

    def _sp_values(self) -> Mapping[str, Any]:
        return {VARIABLE_VALUE: tensor_to_numpy(self.tensor)}

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        t = self.tensor
        if is_lazy(t):
            return {}
        return {VARIABLE_VALUE: ValueSpec(tuple(t.shape), format_dtype(t.dtype))}

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        copy_into(self.tensor, values[VARIABLE_VALUE])

    def _sp_value_targets(self) -> Mapping[str, Any]:
        # plain CPU memory in the stored layout: decoded into directly (load_into's rule);
        # other devices, layouts and subclasses keep copy_into
        from .inplace import _direct

        t = self.tensor
        if is_lazy(t) or not _direct(t, format_dtype(t.dtype)):
            return {}
        return {VARIABLE_VALUE: tensor_to_numpy(t)}


class ModuleAdapter(Trackable):
    """An ``nn.Module``: parameters, persistent buffers, then child modules, by attribute name.

    ``sp.Trackable`` objects kept as plain attributes of the module (for example an
    ``sp.Variable`` step counter) are dependencies too. Child adapters are held strongly here:
    the restore machinery references bound objects weakly, and deferred restores are parked on
    the adapters, so they must live as long as the module's adapter.

    The module is held weakly. While a restore is parked here, the module holds this adapter
    (through its forward pre-hook), so the adapter lives exactly as long as the module; a strong
    reference back would make a cycle that keeps the module, its parameters and the parked
    values alive after the user dropped the module, until the cyclic garbage collector runs
    (TensorFlow's ``test_weakref_root``).
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._module_ref = weakref.ref(module)
        self._held: dict[str, Trackable] = {}
        self._hook: Any = None
        self._extra: Trackable | None = None

    @property
    def module(self) -> torch.nn.Module:
        """The adapted module (raises ReferenceError once it was garbage-collected)."""
        module = self._module_ref()
        if module is None:
            raise ReferenceError("the nn.Module of this ModuleAdapter was garbage-collected")
        return module

    @property
    def name(self) -> str:
        module = self._module_ref()
        return "" if module is None else type(module).__name__

    def __repr__(self) -> str:
        return f"<ModuleAdapter {self.name or '(collected)'}>"

    def _live(self) -> dict[str, Any]:
        m = self.module
        out: dict[str, Any] = {}
        for name, p in m._parameters.items():
            if p is not None and not is_lazy(p):
                out[name] = p
        skip = m._non_persistent_buffers_set
        for name, b in m._buffers.items():
            if b is not None and name not in skip and not is_lazy(b):
                out[name] = b
        for name, child in m._modules.items():
            if child is not None:
                out[name] = child
        for name, value in vars(m).items():
            if isinstance(value, Trackable) and not name.startswith("_") and name not in out:
                out[name] = value
        if type(m).get_extra_state is not torch.nn.Module.get_extra_state:
            # torch's state_dict() saves it under "<module>._extra_state"; without it a save
            # would silently hold less than the module (issue 22)
            if self._extra is None:
                self._extra = TorchStateDictTrackable(_ExtraState(m))
            out[EXTRA_STATE] = self._extra
        return out

    def _sp_children(self) -> Mapping[str, Trackable]:
        children: dict[str, Trackable] = {}
        for name, obj in self._live().items():
            tracked = as_trackable(obj)
            if tracked is not None:
                children[name] = tracked
        self._held.update(children)
        return children

    def _sp_lookup(self, name: str) -> Trackable | None:
        obj = self._live().get(name)
        if obj is None:
            return None
        tracked = as_trackable(obj)
        if tracked is not None:
            self._held[name] = tracked
        return tracked

    # -- deferred restore for lazy (or later attached) parameters and submodules ---------------
    def _sp_defer(self, name: str, position: Any) -> None:
        super()._sp_defer(name, position)
        if self._hook is None:
            # Forward pre-hooks run in registration order: a lazy module registered its own
            # initialization hook in __init__, so ours runs after the parameters materialize.
            self._hook = self.module.register_forward_pre_hook(self._on_forward)

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.run_deferred()

    def run_deferred(self) -> None:
        """Restore every parked checkpoint value whose parameter/child exists now."""
        state = self._sp_state()
        for name in list(state.deferred):
            child = self._sp_lookup(name)
            if child is not None:
                self._sp_handle_deferred(name, child)
        if not state.deferred and self._hook is not None:
            self._hook.remove()
            self._hook = None


def run_deferred_restores(module: torch.nn.Module) -> None:
    """Apply pending (deferred) restores to ``module`` and its submodules now.

    Normally not needed: the next forward of a module with pending restores applies them. Call
    it after materializing lazy parameters by other means (``initialize_parameters``) or after
    assigning a submodule that a restore is waiting for, when no forward runs before the value
    is needed.
    """
    for sub in module.modules():
        adapter = as_trackable(sub)
        if isinstance(adapter, ModuleAdapter):
            adapter.run_deferred()


#: child name of a module's ``get_extra_state()`` (the key suffix torch's state_dict uses)
EXTRA_STATE = "_extra_state"


class _ExtraState:
    """``get_extra_state``/``set_extra_state`` of a module as the state-dict protocol, so the
    state-dict adapter stores it (tensors, arrays, numbers, strings, nested dicts/lists) and
    refuses, naming it, what it cannot store (a ``BytesIO``, an arbitrary object). Holds the
    module weakly: the module's adapter holds this."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = weakref.ref(module)

    def _target(self) -> torch.nn.Module:
        module = self._module()
        if module is None:
            raise ReferenceError("the module of this extra state was garbage-collected")
        return module

    def __repr__(self) -> str:
        module = self._module()
        return f"<extra state of {type(module).__name__ if module is not None else '(collected)'}>"

    def state_dict(self) -> Any:
        return self._target().get_extra_state()

    def load_state_dict(self, state: Any) -> None:
        self._target().set_extra_state(state)


class TorchStateDictTrackable(StateDictTrackable):
    """State-dict adapter that keeps tensor leaves tensors across a round trip.

    Saves like :class:`~shardpoint.StateDictTrackable` (one entry per leaf, the nesting in
    ``.STATE_DICT_STRUCTURE``) and adds ``.TORCH_TENSORS``, the leaves that were tensors, only
    when there are any; ``load_state_dict`` then receives CPU tensors for those leaves.
    """

    def __init__(self, obj: Any) -> None:
        super().__init__(obj, to_numpy=self._leaf_to_numpy)
        self._tensor_flags: list[bool] = []

    def __repr__(self) -> str:
        return f"TorchStateDictTrackable({self.wrapped!r})"

    def _leaf_to_numpy(self, leaf: Any) -> Any:
        is_tensor = isinstance(leaf, torch.Tensor)
        self._tensor_flags.append(is_tensor)
        if is_tensor:
            return tensor_to_numpy(leaf)
        if isinstance(leaf, str | bytes | int | float | bool | type(None) | np.generic):
            return leaf
        if has_handler(leaf):  # sets, dataclasses, enums...: object entries (FORMAT.md §6.1)
            return leaf
        return np.asarray(leaf)

    def _live_tensor_names(self) -> list[str]:
        """Names of the leaves that are tensors in the live ``state_dict()`` now."""
        return list(self._sp_values().get(TENSORS_ATTRIBUTE) or ())

    def _sp_values(self) -> Mapping[str, Any]:
        self._tensor_flags = []
        values = dict(super()._sp_values())
        # leaves are inserted in visiting order, which is the order _leaf_to_numpy ran in
        names = [n for n in values if n != STRUCTURE_ATTRIBUTE]
        tensors = [n for n, flag in zip(names, self._tensor_flags, strict=False) if flag]
        if tensors:
            values[TENSORS_ATTRIBUTE] = tensors
        return values

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        specs = dict(super()._sp_value_specs())
        specs[TENSORS_ATTRIBUTE] = None
        return specs

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        structure = values.get(STRUCTURE_ATTRIBUTE)
        if structure is None:
            raise ValueError(
                f"checkpoint has no {STRUCTURE_ATTRIBUTE} attribute for {self!r}; it was not "
                "written by a state-dict adapter"
            )
        if TENSORS_ATTRIBUTE in values:
            tensor_names = set(values[TENSORS_ATTRIBUTE] or ())
        else:
            # Written by the generic state-dict adapter, which records no tensors (before issue
            # 22 a user's nn.Module subclass could be saved that way): the leaves that are
            # tensors in the live object's state_dict() come back as tensors.
            tensor_names = set(self._live_tensor_names())
        leaves: dict[str, Any] = {}
        for name, value in values.items():
            if name in (STRUCTURE_ATTRIBUTE, TENSORS_ATTRIBUTE):
                continue
            if isinstance(value, np.ndarray):
                value = np.array(value)  # own the memory: the reader may be closed later
                if name in tensor_names:
                    value = numpy_to_tensor(value)
            leaves[name] = value
        self.wrapped.load_state_dict(unflatten(structure, leaves))


def _is_state_dict_object(obj: Any) -> bool:
    if isinstance(obj, type | torch.Tensor | torch.nn.Module | torch.optim.Optimizer):
        return False
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


_REGISTERED = False


def register() -> None:
    """Register the torch adapters in the built-in tier (idempotent): a user's own
    ``register_trackable_adapter`` still wins. Later registrations win within the tier, so the
    specific adapters (tensor, module, optimizer) are registered after the state-dict one."""
    global _REGISTERED
    if _REGISTERED:
        return
    from .optim import OptimizerAdapter

    register_builtin_adapter(_is_state_dict_object, TorchStateDictTrackable)
    register_builtin_adapter(torch.nn.Module, ModuleAdapter)
    register_builtin_adapter(torch.optim.Optimizer, OptimizerAdapter)
    register_builtin_adapter(torch.Tensor, TensorAdapter)
    _REGISTERED = True
