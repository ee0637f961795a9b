"""Adapter for objects with ``state_dict()`` / ``load_state_dict()``.

Such objects (data iterators, schedulers, and — before the dedicated torch adapters of
``shardpoint.torch`` — torch modules and optimizers) are trackable without subclassing anything.
The state dict may nest dicts, lists and tuples of arrays and plain numbers/strings. Each leaf is
saved as its own entry: attribute ``a/b/0`` of the object (key ``obj/.ATTRIBUTES/a/b/0``), and
the nesting (including non-string keys such as torch's integer parameter ids) is recorded in one
JSON attribute, ``.STATE_DICT_STRUCTURE``. Restore rebuilds the nested dict and calls
``load_state_dict`` once with numpy arrays (or whatever ``from_numpy`` makes of them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedDTypeError
from ..storage.dtypes import format_name
from ..storage.nested_keys import decode_key, flat_key, key_tag, put_leaf
from ..storage.objects import encode_object, has_handler
from .errors import UnsaveableObjectError
from .trackable import Trackable, ValueSpec, register_fallback_adapter

__all__ = ["StateDictTrackable", "STRUCTURE_ATTRIBUTE"]

STRUCTURE_ATTRIBUTE = ".STATE_DICT_STRUCTURE"
_SCALARS = (str, bytes, int, float, bool, type(None))


def _default_to_numpy(leaf: Any) -> Any:
    if isinstance(leaf, _SCALARS):
        return leaf
    if isinstance(leaf, np.generic) or has_handler(leaf):
        return leaf  # numpy scalars, sets, dataclasses...: object entries (FORMAT.md §6.1)
    return np.asarray(leaf)


class StateDictTrackable(Trackable):
    """Trackable adapter around an object with ``state_dict``/``load_state_dict``.

    ``to_numpy`` converts each leaf for saving (default ``np.asarray`` for non-scalars);
    ``from_numpy`` converts a restored leaf before ``load_state_dict`` (default: unchanged).
    Subclasses may override ``_sp_restore_values`` to copy in place into existing storage.
    """

    _sp_open_attributes = True

    def __init__(
        self,
        obj: Any,
        to_numpy: Callable[[Any], Any] | None = None,
        from_numpy: Callable[[Any], Any] | None = None,
    ) -> None:
        self.wrapped = obj
        self._to_numpy = to_numpy or _default_to_numpy
        self._from_numpy = from_numpy or (lambda leaf: leaf)

    @property
    def name(self) -> str:
        return type(self.wrapped).__name__

    def __repr__(self) -> str:
        return f"StateDictTrackable({self.wrapped!r})"

    # -- flatten / unflatten -----------------------------------------------------------------
    def _flatten(self) -> tuple[dict[str, Any], Any]:
        leaves: dict[str, Any] = {}

        def visit(value: Any, path: list[str]) -> Any:
            if isinstance(value, Mapping):
                items = []
                for key, sub in value.items():
                    if not path and key == STRUCTURE_ATTRIBUTE:
                        raise ValueError(f"state_dict key {STRUCTURE_ATTRIBUTE!r} is reserved")
                    items.append([str(key), key_tag(key), visit(sub, [*path, str(key)])])
                return {"d": items}
            if isinstance(value, list | tuple):
                tag = "l" if isinstance(value, list) else "t"
                return {tag: [visit(sub, [*path, str(i)]) for i, sub in enumerate(value)]}
            key = flat_key(path)
            name = put_leaf(leaves, key, _storable(key, value, self._to_numpy))
            return {"v": name}

        structure = visit(self.wrapped.state_dict(), [])
        return leaves, structure

    def _unflatten(self, structure: Any, values: Mapping[str, Any]) -> Any:
        if "d" in structure:
            return {
                decode_key(key, tag): self._unflatten(sub, values)
                for key, tag, sub in structure["d"]
            }
        if "l" in structure:
            return [self._unflatten(sub, values) for sub in structure["l"]]
        if "t" in structure:
            return tuple(self._unflatten(sub, values) for sub in structure["t"])
        leaf = values[structure["v"]]
        if isinstance(leaf, np.ndarray):
            leaf = np.array(leaf)  # own the memory: the reader's mapping may be closed later
        return self._from_numpy(leaf)

    # -- trackable protocol -----------------------------------------------------------------
    def _sp_values(self) -> Mapping[str, Any]:
        leaves, structure = self._flatten()
        return {STRUCTURE_ATTRIBUTE: structure, **leaves}

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        leaves, _ = self._flatten()
        specs: dict[str, ValueSpec | None] = {STRUCTURE_ATTRIBUTE: None}
        for name, leaf in leaves.items():
            if isinstance(leaf, np.ndarray):
                specs[name] = ValueSpec(leaf.shape, leaf.dtype.name)
            else:
                specs[name] = None
        return specs

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        structure = values.get(STRUCTURE_ATTRIBUTE)
        if structure is None:
            raise ValueError(
                f"checkpoint has no {STRUCTURE_ATTRIBUTE} attribute for {self!r}; it was not "
                "written by a state-dict adapter"
            )
        self.wrapped.load_state_dict(self._unflatten(structure, values))


def _storable(key: str, leaf: Any, to_numpy: Callable[[Any], Any]) -> Any:
    """``to_numpy(leaf)``, checked to be a value the format stores exactly; anything else
    raises UnsaveableObjectError naming the state-dict entry (a save never writes less than
    the object holds: ``np.asarray`` of an arbitrary object is an object array, of a set a 0-d
    object array, and neither can be stored)."""
    try:
        converted = to_numpy(leaf)
    except UnsaveableObjectError:
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        raise UnsaveableObjectError(_leaf_message(key, leaf, str(exc))) from exc
    if isinstance(converted, np.ndarray | np.generic):
        try:
            format_name(converted.dtype)
        except UnsupportedDTypeError as exc:
            raise UnsaveableObjectError(_leaf_message(key, leaf, str(exc))) from exc
    elif has_handler(converted):
        try:  # described completely, or refused now (naming the entry), before any write
            encode_object(key, converted)
        except (UnsupportedDTypeError, InvalidArgumentError) as exc:
            raise UnsaveableObjectError(_leaf_message(key, leaf, str(exc))) from exc
    elif not isinstance(converted, _SCALARS):
        raise UnsaveableObjectError(
            _leaf_message(key, leaf, f"the adapter made a {type(converted).__name__} of it")
        )
    return converted


def _leaf_message(key: str, leaf: Any, why: str) -> str:
    return (
        f"state_dict() entry {key!r} is a {type(leaf).__module__}.{type(leaf).__qualname__}, "
        f"which the state-dict adapter cannot store ({why}). Only arrays of the format's "
        "dtypes, numpy scalars, str, bytes, int, float, bool, None, dicts/lists/tuples of "
        "them and the objects of FORMAT.md §6.1 (sets, dataclasses, enums...; other classes "
        "after shardpoint.register_type) are stored; convert the entry in state_dict() or register an adapter for the "
        "object (register_trackable_adapter). Nothing was written."
    )


def has_state_dict(value: Any) -> bool:
    """True for (non-class) objects with callable ``state_dict`` and ``load_state_dict``."""
    if isinstance(value, type):
        return False
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


# The generic fallback: any object with the state-dict protocol is trackable, unless a specific
# adapter (the torch ones, a user's) claims it first.
register_fallback_adapter(has_state_dict, StateDictTrackable)
