"""``Module``: the base class whose attribute assignment tracks dependencies."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import DuplicateDependencyError
from .trackable import NoDependency, Trackable, as_trackable
from .variables import VARIABLE_VALUE, Variable
from .wrappers import wrap_value

__all__ = ["Module"]


class Module(Trackable):
    """Base class for objects with checkpointable state.

    Assigning a trackable (a Variable, another Module, an object with a registered adapter or
    with ``state_dict``/``load_state_dict``) to an attribute makes it a dependency named after
    the attribute; plain lists, dicts and tuples of trackables are wrapped and tracked; anything
    else (numbers, strings, arrays, sets, defaultdicts) is a plain attribute and never saved.
    Re-assigning replaces the dependency; ``del`` removes it; ``NoDependency(x)`` stores ``x``
    untracked. If a ``restore()`` is waiting for a dependency of that name, the assigned object
    and its whole subtree are restored inside the assignment.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_sp_"):
            object.__setattr__(self, name, value)
            return
        if isinstance(value, NoDependency):
            self._sp_untrack(name)
            object.__setattr__(self, name, value.value)
            return
        value = wrap_value(value)
        # set the attribute before tracking: a deferred restore running inside _sp_track may
        # reach code that reads the attribute back
        object.__setattr__(self, name, value)
        tracked = as_trackable(value)
        if tracked is not None:
            self._sp_track(name, tracked, overwrite=True)
        else:
            self._sp_untrack(name)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        self._sp_untrack(name)

    def add_variable(
        self,
        name: str,
        shape: tuple[int, ...] | None = None,
        dtype: Any = np.float32,
        initializer: Callable[[tuple[int, ...], np.dtype], Any] | None = None,
        trainable: bool = True,
        overwrite: bool = False,
    ) -> Variable:
        """Create a Variable attribute ``name``, restoring it on creation if possible (RES-04).

        When a ``restore()`` is waiting for a dependency called ``name`` and the checkpoint
        holds a plain variable value there, the variable is created directly from that value and
        ``initializer`` is not called. Otherwise ``initializer(shape, dtype)`` (zeros by
        default) provides the initial value. A name already used by a dependency raises
        ``DuplicateDependencyError`` (a ValueError, TensorFlow's wording) unless ``overwrite``.
        """
        if not overwrite and self._sp_lookup(name) is not None:
            raise DuplicateDependencyError(
                f"Called Module.add_variable() with name={name!r}, but a trackable with this "
                "name is already declared as a dependency. Names must be unique (or "
                "overwrite=True)."
            )
        dtype = np.dtype(dtype)
        value = None
        for position in self._sp_pending(name):  # newest restore first (restore_order)
            value = position.simple_value(VARIABLE_VALUE, shape, dtype)
            if value is not None:
                break
        if value is None:
            if shape is None:
                raise ValueError(f"add_variable({name!r}) needs a shape when not restoring")
            value = (
                initializer(tuple(shape), dtype)
                if initializer is not None
                else np.zeros(shape, dtype=dtype)
            )
        var = Variable(value, dtype=dtype, name=name, trainable=trainable)
        setattr(self, name, var)
        return var

    @property
    def variables(self) -> tuple[Variable, ...]:
        """Every Variable reachable from this module (breadth-first, each once), as a tuple
        (as ``tf.Module.variables``)."""
        return tuple(_collect_variables(self, trainable_only=False))

    @property
    def trainable_variables(self) -> tuple[Variable, ...]:
        """Every trainable Variable reachable from this module, as a tuple (as TensorFlow)."""
        return tuple(_collect_variables(self, trainable_only=True))


def _collect_variables(root: Trackable, trainable_only: bool) -> list[Variable]:
    seen = {id(root)}
    queue = deque([root])
    out: list[Variable] = []
    while queue:
        obj = queue.popleft()
        if isinstance(obj, Variable) and (obj.trainable or not trainable_only):
            out.append(obj)
        for child in obj._sp_children().values():
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
    return out
