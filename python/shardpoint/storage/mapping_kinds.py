"""Which kind of mapping a nested state held, so a load gives the same kind back.

A ``state_dict()`` is an ``OrderedDict`` whose ``_metadata`` attribute carries each module's
``version``: ``Module._load_from_state_dict`` passes it on, and modules migrate older
checkpoints by it (``if version is None or version < 2``). Rebuilt as a plain ``dict`` it
loses the versions, and a module would "migrate" a current checkpoint: silently wrong values.
Schedulers keep ``Counter``\\ s (``MultiStepLR.milestones``) whose methods they call. So a
structure node of a mapping (``{"d": [...]}``) may also hold:

- ``"c"``: ``"OrderedDict"``, ``"Counter"`` or ``"defaultdict"`` (exact types only: a user's
  subclass is a ``dict`` as before, never a class looked up by name);
- ``"f"``: a ``defaultdict``'s factory, when it is one of :data:`FACTORIES`;
- ``"m"``: an ``OrderedDict``'s ``_metadata``, when it is JSON (prefix -> plain values).

Readers of earlier versions ignore these keys (they read ``"d"``); a node without them, or
with values this version does not know (a hostile or newer file), is a plain ``dict``.
"""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Mapping
from typing import Any

__all__ = ["FACTORIES", "mapping_kind", "rebuild_mapping"]

#: ``defaultdict`` factories kept by name: the builtin containers and numbers
FACTORIES: dict[str, Any] = {
    f.__name__: f for f in (list, dict, set, int, float, str, tuple, OrderedDict, Counter)
}


def _plain_json(value: Any) -> bool:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return bool(json.loads(text) == value)


def mapping_kind(value: Mapping[Any, Any]) -> dict[str, Any]:
    """The extra keys of the structure node of ``value`` (empty for a plain ``dict``)."""
    kind = type(value)
    if kind is OrderedDict:
        out: dict[str, Any] = {"c": "OrderedDict"}
        meta = getattr(value, "_metadata", None)
        if isinstance(meta, Mapping) and all(isinstance(k, str) for k in meta):
            plain = {k: dict(v) if isinstance(v, Mapping) else v for k, v in meta.items()}
            if _plain_json(plain):
                out["m"] = plain
        return out
    if kind is Counter:
        return {"c": "Counter"}
    if kind is defaultdict:
        factory = value.default_factory  # type: ignore[attr-defined]
        name = getattr(factory, "__name__", None)
        if factory is None or FACTORIES.get(str(name)) is factory:
            return {"c": "defaultdict", "f": name if factory is not None else None}
    return {}


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def rebuild_mapping(node: Mapping[str, Any], items: dict[Any, Any]) -> Any:
    """``items`` as the kind of mapping ``node`` records (a ``dict`` when it records none it
    knows)."""
    kind = node.get("c")
    if kind == "OrderedDict":
        out: OrderedDict[Any, Any] = OrderedDict(items)
        meta = node.get("m")
        if isinstance(meta, Mapping) and all(isinstance(k, str) for k in meta):
            # torch's own type for it; each module's entry a dict, as state_dict() makes them
            out._metadata = OrderedDict(  # type: ignore[attr-defined]
                (k, dict(v) if isinstance(v, Mapping) else v) for k, v in meta.items()
            )
        return out
    if kind == "Counter" and all(isinstance(v, int | float) and _finite(v) for v in items.values()):
        return Counter(items)
    if kind == "defaultdict":
        name = node.get("f")
        if name is None or (isinstance(name, str) and name in FACTORIES):
            return defaultdict(FACTORIES[name] if name is not None else None, items)
    return items
