"""``Variable``: a mutable, numpy-backed value that a checkpoint saves and restores.

The value lives in one numpy array owned by the Variable; ``assign`` and restore write into that
array in place (so views handed out by ``.value()`` see restored values), while ``.numpy()``
returns a copy like TensorFlow's ``Variable.numpy()``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .trackable import Trackable, ValueSpec

__all__ = ["Variable", "VARIABLE_VALUE", "SlotProvider"]

#: attribute name under which a variable's value is stored (TF's key scheme)
VARIABLE_VALUE = "VARIABLE_VALUE"


class Variable(Trackable):
    """A numpy-backed variable.

    ``initial_value`` may be anything ``np.array`` accepts, or a zero-argument callable returning
    it. ``dtype`` defaults to the value's own dtype (Python floats become float64; pass
    ``dtype=np.float32`` for TF-like defaults). Unlike ``tf.Variable``, a Variable is hashable by
    identity and does not define elementwise ``==`` (compare ``v.numpy()`` instead), so it can be
    a dict key or a set member (a set is still never tracked).
    """

    def __init__(
        self,
        initial_value: Any,
        dtype: Any = None,
        name: str | None = None,
        trainable: bool = True,
    ) -> None:
        if callable(initial_value):
            initial_value = initial_value()
        value = np.array(initial_value, dtype=dtype, copy=True)
        if value.dtype == object:
            raise TypeError(f"Variable needs a numeric or bool value, got {initial_value!r}")
        self._value = value
        self.name = name or "Variable"
        self.trainable = trainable

    # -- value access ----------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A copy of the current value (0-d arrays for scalars)."""
        return self._value.copy()

    def value(self) -> np.ndarray:
        """The live backing array (read-write view; assignments are visible through it)."""
        return self._value

    def read_value(self) -> np.ndarray:
        """Alias of :meth:`numpy` (TF name)."""
        return self.numpy()

    @property
    def shape(self) -> tuple[int, ...]:
        return self._value.shape

    @property
    def dtype(self) -> np.dtype:
        return self._value.dtype

    @property
    def ndim(self) -> int:
        return self._value.ndim

    @property
    def size(self) -> int:
        return self._value.size

    def assign(self, value: Any) -> Variable:
        """Write ``value`` into the variable; shape must match, dtype casts only same-kind."""
        arr = np.asarray(value)
        if arr.shape != self._value.shape:
            raise ValueError(
                f"Cannot assign a value of shape {arr.shape} to variable {self.name!r} of shape "
                f"{self._value.shape}"
            )
        np.copyto(self._value, arr, casting="same_kind")
        return self

    def assign_add(self, delta: Any) -> Variable:
        """``self += delta`` in place."""
        return self.assign(self._value + np.asarray(delta, dtype=self._value.dtype))

    def assign_sub(self, delta: Any) -> Variable:
        """``self -= delta`` in place."""
        return self.assign(self._value - np.asarray(delta, dtype=self._value.dtype))

    # -- numpy / numeric interop -----------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if dtype is None and not copy:
            return self._value
        return np.array(self._value, dtype=dtype, copy=True)

    def __float__(self) -> float:
        return float(self._value)

    def __int__(self) -> int:
        return int(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __index__(self) -> int:
        if self._value.dtype.kind not in "iub":
            raise TypeError(f"only integer variables can be used as an index, not {self.dtype}")
        return int(self._value)

    def __len__(self) -> int:
        return len(self._value)

    def __getitem__(self, item: Any) -> Any:
        return self._value[item].copy()

    def __repr__(self) -> str:
        return (
            f"<sp.Variable {self.name!r} shape={self._value.shape} dtype={self._value.dtype.name}"
            f", numpy={np.array2string(self._value, threshold=6)}>"
        )

    # -- checkpoint protocol ---------------------------------------------------------------
    def _sp_values(self) -> Mapping[str, Any]:
        return {VARIABLE_VALUE: self._value}

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        return {VARIABLE_VALUE: ValueSpec(self._value.shape, _spec_name(self._value.dtype))}

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        # shape and dtype were checked by the restore coordinator; copy into our own buffer
        # (the reader's array may be a view of a memory map that is closed later)
        np.copyto(self._value, np.asarray(values[VARIABLE_VALUE]), casting="no")


def _spec_name(dtype: np.dtype) -> str:
    """The dtype name a checkpoint records for values of ``dtype``: packed float4 is a uint8
    array tagged in ``dtype.metadata`` (shardpoint.dtypes.PACKED_FP4), stored under its tag."""
    tag = dtype.metadata.get("shardpoint_dtype") if dtype.metadata else None
    return str(tag) if tag else dtype.name


def _binary(op: Any, reflected: bool = False) -> Any:
    if reflected:

        def method(self: Variable, other: Any) -> Any:
            return op(np.asarray(other), self._value)

    else:

        def method(self: Variable, other: Any) -> Any:
            return op(self._value, np.asarray(other))

    return method


for _name, _op in {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
}.items():
    setattr(Variable, f"__{_name}__", _binary(_op))
    setattr(Variable, f"__r{_name}__", _binary(_op, reflected=True))
for _name, _op in {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}.items():
    setattr(Variable, f"__{_name}__", _binary(_op))
setattr(Variable, "__neg__", lambda self: -self._value)  # noqa: B010 - set like the ops above
setattr(Variable, "__pos__", lambda self: +self._value)  # noqa: B010
setattr(Variable, "__abs__", lambda self: abs(self._value))  # noqa: B010
# numpy ufuncs treat Variables through __array__; make binary ops with an ndarray on the left
# call our reflected methods instead of numpy iterating over us.
setattr(Variable, "__array_priority__", 100)  # noqa: B010


class SlotProvider:
    """Mixin implementing the slot protocol for optimizers.

    A slot is a per-variable :class:`Variable` (Adam's ``m`` and ``v``).
    Slots are saved under ``<var path>/.OPTIMIZER_SLOT/<optimizer path>/<slot>/...`` only when
    both the variable and the optimizer are reachable, and on restore they are created (from the
    checkpointed value) as soon as both are bound, even if the optimizer is attached later.
    """

    def _sp_slot_table(self) -> dict[tuple[int, str], tuple[Any, Any]]:
        try:
            return self.__dict__["_sp_slots"]
        except KeyError:
            table: dict[tuple[int, str], tuple[Any, Any]] = {}
            object.__setattr__(self, "_sp_slots", table)
            return table

    def add_slot(self, variable: Any, slot_name: str, initial_value: Any = None) -> Any:
        """Return the slot ``slot_name`` of ``variable``, creating it (zeros by default)."""
        table = self._sp_slot_table()
        entry = table.get((id(variable), slot_name))
        if entry is not None:
            return entry[1]
        if initial_value is None:
            initial_value = np.zeros(variable.shape, dtype=variable.dtype)
        slot = Variable(initial_value, dtype=variable.dtype, name=slot_name)
        table[(id(variable), slot_name)] = (variable, slot)
        return slot

    def get_slot(self, variable: Any, slot_name: str) -> Any:
        """The slot variable, or None."""
        entry = self._sp_slot_table().get((id(variable), slot_name))
        return None if entry is None else entry[1]

    # -- protocol used by the checkpoint machinery -----------------------------------------
    def _sp_slot_variables(self) -> Iterable[tuple[Any, str, Any]]:
        """``(variable, slot name, slot variable)`` for every slot, in creation order."""
        return [(var, name, slot) for (_, name), (var, slot) in self._sp_slot_table().items()]

    def _sp_get_slot(self, variable: Any, slot_name: str) -> Any:
        return self.get_slot(variable, slot_name)

    def _sp_create_slot(self, variable: Any, slot_name: str, value: Any) -> Any:
        """Restore-on-create: make the slot directly from the checkpointed value."""
        return self.add_slot(variable, slot_name, initial_value=value)
