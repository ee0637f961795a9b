"""Trackable adapters: Keras 3 layers, models, optimizers and variables in ``sp.Checkpoint``.

Edges are named the way TensorFlow + Keras 3 names them (``net/l1/_kernel``,
``optimizer/_variables/2``, ``model/_functional/_operations/1/bias``): an object's dependencies
are its attributes, in assignment order, whose values are Keras variables, layers, optimizers,
``sp`` trackables, or lists/tuples/dicts holding them (children named by index or string key,
the rules of :mod:`shardpoint.objgraph.wrappers`). Keras's own bookkeeping lists of a layer
(``_trainable_variables``, ``_layers``, ...) are skipped, as TensorFlow skips them.

One deliberate difference: TensorFlow + Keras 3 silently drops layers kept in a list or dict
attribute of a layer (Keras wraps those in its own list type, which TensorFlow does not track);
here they are saved (``model/blocks/0/_kernel``).

Deferred restore: a variable that does not exist yet (a layer not built, an optimizer before its
first ``apply_gradients``) is parked on its owner's adapter, and the owner's ``build`` is
wrapped (on that instance only) so that the values are assigned right after it creates them.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import keras
import numpy as np
from keras.src.backend.common.stateless_scope import in_stateless_scope

from ..objgraph.errors import UnsaveableObjectError
from ..objgraph.trackable import (
    Trackable,
    ValueSpec,
    as_trackable,
    private_alias,
    register_builtin_adapter,
)
from ..objgraph.variables import VARIABLE_VALUE

__all__ = [
    "KerasVariableAdapter",
    "KerasObjectAdapter",
    "KerasContainerAdapter",
    "run_deferred_restores",
    "register",
]

# Keras's per-layer bookkeeping, set with TensorFlow's attribute tracking switched off
# (Layer._initialize_tracker): never dependencies.
_LAYER_INTERNALS = frozenset(
    {
        "_tracker",
        "_trainable_variables",
        "_non_trainable_variables",
        "_layers",
        "_metrics",
        "_seed_generators",
        "_torch_params",  # torch backend: the ParameterDict mirror of the layer's variables
    }
)
_MAX_CONTAINER_DEPTH = 64
# hyper-parameters tf.keras 2's legacy optimizers saved as variables (Keras 3: Python floats)
_LEGACY_HYPERPARAMETERS = frozenset(
    {"beta_1", "beta_2", "epsilon", "rho", "momentum", "decay", "initial_accumulator_value"}
)
_KERAS2_LAYER_EDGE = re.compile(r"layer(_with_weights)?-(0|[1-9][0-9]{0,8})")
# TF slot name -> the Keras 3 optimizer list holding that slot for each trainable variable
# (Adam/AdamW/Adamax/Nadam: m, v, vhat; SGD: momentum)
_SLOT_LISTS = {
    "m": "_momentums",
    "v": "_velocities",
    "vhat": "_velocity_hats",
    "momentum": "_momentums",
}


def _torch_internals() -> frozenset[str]:
    """The attributes every ``torch.nn.Module`` has (hooks, _parameters, ...): a Keras layer on
    the torch backend is a torch module, and these are no part of the Keras object graph."""
    global _TORCH_INTERNALS
    if _TORCH_INTERNALS is None:
        try:
            import torch

            _TORCH_INTERNALS = frozenset(vars(torch.nn.Module()))
        except ImportError:  # pragma: no cover - torch backend without torch cannot happen
            _TORCH_INTERNALS = frozenset()
    return _TORCH_INTERNALS


_TORCH_INTERNALS: frozenset[str] | None = None


def _is_keras_trackable(value: Any) -> bool:
    return isinstance(
        value, Trackable | keras.Variable | keras.layers.Layer | keras.optimizers.Optimizer
    )


def _holds_trackables(value: Any, depth: int = 0) -> bool:
    if depth > _MAX_CONTAINER_DEPTH:
        return False
    if _is_keras_trackable(value):
        return True
    if isinstance(value, Mapping):
        return any(_holds_trackables(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_trackables(v, depth + 1) for v in value)
    return False


def _is_container(value: Any) -> bool:
    return isinstance(value, list | tuple | Mapping) and not isinstance(value, str | bytes)


class _ChildHolder(Trackable):
    """Shared logic of object and container adapters: named children computed live from the
    wrapped object, container adapters kept (so parked restores survive), deferred restores
    re-checked when the owning Keras object builds."""

    def __init__(self, owner: KerasObjectAdapter | None) -> None:
        # weak: the owner holds its containers strongly, not the other way round
        self._owner_ref = weakref.ref(owner) if owner is not None else None
        self._containers: dict[str, KerasContainerAdapter] = {}
        # child adapters held strongly: the restore machinery references bound objects weakly
        # and parks deferred restores on adapters, so they must live as long as this one
        self._held: dict[str, Trackable] = {}

    def _items(self) -> Iterator[tuple[str, Any]]:
        """(name, value) pairs of the wrapped object: each subclass says where they live
        (a Keras object's attributes, a list's indices, a dict's keys)."""
        raise NotImplementedError(f"{type(self).__name__} must define _items()")

    def _owner(self) -> KerasObjectAdapter | None:
        return self._owner_ref() if self._owner_ref is not None else None

    def _wrap(self, name: str, value: Any, *, lookup: bool) -> Trackable | None:
        if _is_keras_trackable(value):
            tracked = as_trackable(value)
            if tracked is not None:
                self._held[name] = tracked
            return tracked
        if _is_container(value) and (lookup or _holds_trackables(value)):
            held = self._containers.get(name)
            if held is None or held.container is not value:
                owner = self if isinstance(self, KerasObjectAdapter) else self._owner()
                held = KerasContainerAdapter(value, owner)
                self._containers[name] = held
            return held
        return None

    def _sp_children(self) -> Mapping[str, Trackable]:
        out: dict[str, Trackable] = {}
        for name, value in self._items():
            child = self._wrap(name, value, lookup=False)
            if child is not None:
                out[name] = child
        return out

    def _sp_lookup(self, name: str) -> Trackable | None:
        alias = private_alias(name)
        fallback = None
        for item_name, value in self._items():
            if item_name == name:
                wrapped = self._wrap(name, value, lookup=True)
                if wrapped is not None:
                    return wrapped
                break  # an attribute of that name that is not trackable (a float): see below
            if alias is not None and item_name == alias and fallback is None:
                fallback = (item_name, value)
        if fallback is not None and _is_keras_trackable(fallback[1]):
            # tf.keras (Keras 2) saved Dense weights as 'kernel'; Keras 3 keeps '_kernel'
            return self._wrap(fallback[0], fallback[1], lookup=True)
        layer = self._keras2_layer_edge(name)
        if layer is not None:
            return self._wrap(name, layer, lookup=True)
        return self._legacy_hyperparameter(name)

    def _legacy_hyperparameter(self, name: str) -> Trackable | None:
        """tf.keras 2's legacy optimizers kept hyper-parameters (``beta_1``, ``rho`` ...) as
        variables; a Keras 3 optimizer keeps Python floats: restore into those."""
        opt = getattr(self, "obj", None)
        if not isinstance(opt, keras.optimizers.Optimizer) or name not in _LEGACY_HYPERPARAMETERS:
            return None
        current = getattr(opt, name, None)
        if name != "decay" and (isinstance(current, bool) or not isinstance(current, float | int)):
            return None
        adapter = _HyperparameterAdapter(opt, name)
        self._held[name] = adapter
        return adapter

    def _keras2_layer_edge(self, name: str) -> Any:
        """tf.keras 2 named a Sequential/functional model's layers ``layer-N`` (``model.layers[N]``)
        and ``layer_with_weights-N`` (the N-th of those with weights); Keras 3's
        ``model.layers`` lists the same layers in the same order. None for other names."""
        match = _KERAS2_LAYER_EDGE.fullmatch(name)
        layers = getattr(getattr(self, "obj", None), "layers", None) if match else None
        if match is None or not isinstance(layers, list):
            return None
        index = int(match.group(2))
        if match.group(1):
            layers = [layer for layer in layers if layer.weights]
        return layers[index] if index < len(layers) else None

    def _sp_defer(self, name: str, position: Any) -> None:
        super()._sp_defer(name, position)
        owner = self if isinstance(self, KerasObjectAdapter) else self._owner()
        if owner is not None:
            owner._install_build_hook()

    def run_deferred(self) -> None:
        """Restore every parked value whose object exists now (here and in held containers)."""
        state = self._sp_state()
        for name in list(state.deferred):
            child = self._sp_lookup(name)
            if child is not None and (
                not isinstance(child, KerasContainerAdapter) or len(child) > 0
            ):
                self._sp_handle_deferred(name, child)
        for container in list(self._containers.values()):
            container.run_deferred()

    def _has_deferred(self) -> bool:
        if self._sp_state().deferred:
            return True
        return any(c._has_deferred() for c in self._containers.values())


class KerasVariableAdapter(Trackable):
    """A ``keras.Variable`` (any backend) as a checkpoint variable (``VARIABLE_VALUE``)."""

    def __init__(self, variable: Any) -> None:
        self.variable = variable

    @property
    def name(self) -> str:
        return str(getattr(self.variable, "path", "") or getattr(self.variable, "name", ""))

    def __repr__(self) -> str:
        v = self.variable
        return f"<KerasVariableAdapter {self.name!r} shape={tuple(v.shape)} dtype={v.dtype}>"

    def _sp_values(self) -> Mapping[str, Any]:
        return {VARIABLE_VALUE: np.asarray(keras.ops.convert_to_numpy(self.variable.value))}

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        v = self.variable
        return {VARIABLE_VALUE: ValueSpec(tuple(int(d) for d in v.shape), str(v.dtype))}

    def _sp_check_saveable(self) -> None:
        if _pending_initializer(self.variable):
            raise UnsaveableObjectError(
                f"Keras variable {self.name!r} is not initialized yet (created while Keras built "
                "the model symbolically); call the model once before saving"
            )

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        # np.array: own the bytes (the reader's array may view a mapping closed later)
        value = np.array(values[VARIABLE_VALUE])
        v = self.variable
        if _pending_initializer(v):
            # Created inside a stateless scope (Keras builds a subclassed model by tracing its
            # call symbolically): Keras initializes it from its initializer once the scope
            # ends, and an assign() now would be recorded in the scope and dropped. The
            # restored value becomes the initializer.
            v._initializer = _RestoredValue(value, self.name)
            return
        if in_stateless_scope():
            v._direct_assign(v._convert_to_tensor(value, dtype=v.dtype))
            return
        v.assign(value)


class _HyperparameterAdapter(Trackable):
    """A float hyper-parameter of a Keras 3 optimizer restored from the variable a tf.keras 2
    legacy optimizer saved for it. ``decay`` (legacy time-based learning-rate decay) has no
    Keras 3 counterpart: only 0 (no decay) is accepted."""

    def __init__(self, optimizer: Any, attribute: str) -> None:
        self.optimizer = optimizer
        self.attribute = attribute

    def __repr__(self) -> str:
        return f"<hyper-parameter {self.attribute!r} of {type(self.optimizer).__name__}>"

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        return {VARIABLE_VALUE: None}

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        value = np.asarray(values[VARIABLE_VALUE])
        if value.shape != () or value.dtype.kind not in "fiu":
            raise ValueError(
                f"{self!r}: expected a numeric scalar, the checkpoint holds {value.dtype} "
                f"{value.shape}"
            )
        number = float(value)
        if self.attribute == "decay":
            if number != 0.0:
                raise ValueError(
                    f"the checkpoint's legacy optimizer used decay={number}; Keras 3 optimizers "
                    "have no time-based decay (use a LearningRateSchedule)"
                )
            return
        setattr(self.optimizer, self.attribute, number)


def _pending_initializer(variable: Any) -> bool:
    return getattr(variable, "_value", True) is None and callable(
        getattr(variable, "_initializer", None)
    )


class _RestoredValue:
    """An initializer returning a checkpointed value (shape checked again when called)."""

    def __init__(self, value: np.ndarray, name: str) -> None:
        self.value = value
        self.name = name

    def __call__(self, shape: Any, dtype: Any = None) -> np.ndarray:
        if tuple(shape) != self.value.shape:
            raise ValueError(
                f"restored value of {self.name!r} has shape {self.value.shape}, the variable "
                f"{tuple(shape)}"
            )
        return self.value


class KerasObjectAdapter(_ChildHolder):
    """A Keras layer, model or optimizer: its trackable attributes are its dependencies."""

    def __init__(self, obj: Any) -> None:
        super().__init__(None)
        self.obj = obj
        self._hooked = False
        # restores waiting for this optimizer's slots (it builds them on its first step)
        self._slot_callbacks: list[Any] = []

    @property
    def name(self) -> str:
        return str(getattr(self.obj, "name", "") or type(self.obj).__name__)

    def __repr__(self) -> str:
        return f"<KerasObjectAdapter {type(self.obj).__name__} {self.name!r}>"

    def _items(self) -> Iterator[tuple[str, Any]]:
        obj = self.obj
        is_layer = isinstance(obj, keras.layers.Layer)
        skip: frozenset[str] = _LAYER_INTERNALS if is_layer else frozenset({"_tracker"})
        attrs = vars(obj)
        torch_modules = None
        if is_layer and "_modules" in attrs and "_parameters" in attrs:
            # torch backend: sub-layers live in torch's _modules, not in the instance dict
            skip = skip | _torch_internals()
            torch_modules = attrs["_modules"]
        for name, value in attrs.items():
            if name not in skip:
                yield name, value
        if torch_modules is not None:
            for name, value in torch_modules.items():
                if name not in skip and isinstance(value, keras.layers.Layer):
                    yield name, value

    # -- slots: TF's legacy optimizers saved Adam's moments as '.OPTIMIZER_SLOT' slots ------------
    def _sp_get_slot(self, variable: Any, slot_name: str) -> Any:
        """The Keras 3 optimizer variable holding slot ``slot_name`` of ``variable`` (an
        adapter), or None (not an optimizer, not built, unknown slot or variable)."""
        opt = self.obj
        target = getattr(variable, "variable", None)
        attr = _SLOT_LISTS.get(slot_name)
        if attr is None or target is None or not getattr(opt, "built", False):
            return None
        slots = getattr(opt, attr, None)
        try:
            index = opt._get_variable_index(target)
        except (AttributeError, KeyError):
            return None
        if slots is None or not 0 <= index < len(slots):
            return None
        adapter = as_trackable(slots[index])
        if adapter is not None:
            # held: the restore binds it weakly, and the status asks about it later
            self._held[f"{attr}/{index}"] = adapter
        return adapter

    def _sp_slots_later(self, callback: Any) -> bool:
        """Slots of a Keras optimizer exist only once it is built (all at once, on its first
        step): until then, keep ``callback`` (the restore's) and call it right after build."""
        opt = self.obj
        if not isinstance(opt, keras.optimizers.Optimizer) or getattr(opt, "built", False):
            return False
        self._slot_callbacks.append(callback)
        self._install_build_hook()
        return True

    def _sp_create_slot(self, variable: Any, slot_name: str, value: Any) -> Any:
        """Never called for a Keras optimizer (slots exist once built); None: not created."""
        return None

    def run_deferred(self) -> None:
        super().run_deferred()
        callbacks, self._slot_callbacks = self._slot_callbacks, []
        for callback in callbacks:
            callback()

    def _has_deferred(self) -> bool:
        return bool(self._slot_callbacks) or super()._has_deferred()

    # -- deferred restore: run parked restores right after build() creates the variables ------
    def _install_build_hook(self) -> None:
        if self._hooked:
            return
        obj = self.obj
        original = obj.build  # the instance's build_wrapper (layers) or the bound method
        adapter_ref = weakref.ref(self)

        # functools.wraps: Keras inspects build's signature (and its _is_default marker) to
        # decide how to call it; the wrapper must look exactly like what it wraps
        @functools.wraps(original)
        def build_then_restore(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            adapter = adapter_ref()
            if adapter is not None:
                adapter.run_deferred()
                if not adapter._has_deferred():
                    adapter._remove_build_hook(original)
            return result

        object.__setattr__(obj, "build", build_then_restore)
        self._hooked = True

    def _remove_build_hook(self, original: Any) -> None:
        obj = self.obj
        if getattr(original, "__self__", None) is obj:
            # a plain bound method: drop the instance attribute, the class method shows again
            obj.__dict__.pop("build", None)
        else:
            object.__setattr__(obj, "build", original)
        self._hooked = False


class KerasContainerAdapter(_ChildHolder):
    """A list, tuple or dict attribute of a Keras object (Keras's own tracked list/dict types
    included): elements are children named ``"0"``, ``"1"``, … or by string key. The container
    stays the Keras object's own; only its string keys are saved from dicts."""

    def __init__(self, container: Any, owner: KerasObjectAdapter | None) -> None:
        super().__init__(owner)
        self.container = container

    def __len__(self) -> int:
        return len(self.container)

    def __repr__(self) -> str:
        return f"<KerasContainerAdapter {type(self.container).__name__} len={len(self.container)}>"

    def _items(self) -> Iterator[tuple[str, Any]]:
        c = self.container
        if isinstance(c, Mapping):
            for key, value in c.items():
                if isinstance(key, str):
                    yield key, value
        else:
            for i, value in enumerate(c):
                yield str(i), value


def run_deferred_restores(obj: Any) -> None:
    """Apply parked (deferred) restores of ``obj`` and its sub-layers now.

    Not needed normally: ``build`` (a layer's first call, an optimizer's first
    ``apply_gradients``) applies them. Call it after creating variables by other means.
    """
    seen: set[int] = set()
    stack = [obj]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        adapter = as_trackable(current)
        if isinstance(adapter, KerasObjectAdapter):
            adapter.run_deferred()
        if isinstance(current, keras.layers.Layer):
            stack.extend(current._flatten_layers(include_self=False, recursive=False))


_REGISTERED = False


def register() -> None:
    """Register the Keras adapters in the built-in tier (idempotent; a user's
    ``register_trackable_adapter`` still wins). On the torch backend a Keras layer is also a
    ``torch.nn.Module``: the torch adapters are registered first so that these, registered
    later in the same tier, take precedence."""
    global _REGISTERED
    if _REGISTERED:
        return
    if keras.backend.backend() == "torch":
        from ..torch import adapters as _torch_adapters

        _torch_adapters.register()
    register_builtin_adapter(keras.Variable, KerasVariableAdapter)
    register_builtin_adapter((keras.layers.Layer, keras.optimizers.Optimizer), KerasObjectAdapter)
    _REGISTERED = True
