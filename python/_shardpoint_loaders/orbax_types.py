"""orbax's ``CheckpointManager.restore(step)`` without args on a step shardpoint's orbax handler
saved, in any process where shardpoint is installed.

orbax records each item's handler as a type string in the step's metadata
(``shardpoint.jax.orbax.ShardpointCheckpointHandler``) and, when ``restore`` gets no args,
looks that string up in its registry of handler types. A next script that never imports
shardpoint found it missing: "Item "default" was found in the checkpoint, but could not be
restored". This front, installed once orbax's registry module has run, imports
``shardpoint.jax.orbax`` (which registers the handler) the first time a shardpoint type string
is looked up and not found, then looks again; every other lookup is orbax's own.
"""

from __future__ import annotations

from . import _MARK, dress

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["patch_registry"]

_OURS = "shardpoint."


def _front(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_handler_type(handler_typestr: Any) -> Any:
        try:
            return original(handler_typestr)
        except KeyError:
            if not (isinstance(handler_typestr, str) and handler_typestr.startswith(_OURS)):
                raise
        import shardpoint.jax.orbax  # noqa: F401  # registers the handler type

        return original(handler_typestr)

    dress(get_handler_type, original)
    return get_handler_type


def patch_registry(module: ModuleType) -> None:
    """Front ``handler_type_registry.get_handler_type``."""
    current = getattr(module, "get_handler_type", None)
    if current is None or hasattr(current, _MARK):
        return
    module.get_handler_type = _front(current)  # type: ignore[attr-defined]
