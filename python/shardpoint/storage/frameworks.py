"""What the storage face hands out through upper layers without importing them: the tensor
converters of ``open(..., framework=)`` and the foreign formats ``open`` reads in place, both
declared by ``shardpoint/__init__`` as module and function names and imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

__all__ = [
    "declare_framework",
    "framework_converter",
    "declare_in_place_reader",
    "declare_delta",
    "delta_hook",
    "with_delta",
]

# Tensor converters of ``open(..., framework=)``, as ``name -> (module, function)``: declared by
# ``shardpoint/__init__`` (``shardpoint.torch`` and ``shardpoint.jax`` provide them), imported
# on first use, so this layer imports no framework.
_FRAMEWORKS: dict[str, tuple[str, str]] = {}
_FRAMEWORK_NAMES = {
    "np": "np",
    "numpy": "np",
    "pt": "pt",
    "torch": "pt",
    "jax": "jax",
    "flax": "jax",
}


def declare_framework(name: str, module: str, function: str) -> None:
    """Let ``open(..., framework=name)`` convert tensors with ``module.function(array)``."""
    _FRAMEWORKS[name] = (module, function)


def framework_converter(framework: str) -> Callable[[np.ndarray], Any] | None:
    """The tensor converter of a ``framework=`` name (``None`` for numpy)."""
    name = _FRAMEWORK_NAMES.get(framework) if isinstance(framework, str) else None
    if name is None:
        raise InvalidArgumentError(
            f"framework must be 'np' (or 'numpy'), 'pt' (or 'torch') or 'jax' (or 'flax'), "
            f"got {framework!r}"
        )
    if name == "np":
        return None
    if name not in _FRAMEWORKS:
        raise InvalidArgumentError(f"framework={framework!r}: no converter is declared")
    module_name, function = _FRAMEWORKS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidArgumentError(
            f"framework={framework!r} needs {'PyTorch' if name == 'pt' else 'jax'} installed: {e}"
        ) from e
    converter: Callable[[np.ndarray], Any] = getattr(module, function)
    return converter


# Foreign formats that :func:`open` reads in place when ``P.index`` is absent, as
# ``(module, predicate, reader class)`` names. Declared by the package that knows both layers
# (``shardpoint/__init__`` declares the Hugging Face reader of ``shardpoint.convert.hf``): the
# storage face imports no upper layer, and the module is imported only when a path needs it.
_IN_PLACE_READERS: list[tuple[str, str, str]] = []


def declare_in_place_reader(module: str, predicate: str, reader: str) -> None:
    """Let :func:`open` read paths for which ``module.predicate(path)`` is true in place, as
    ``module.reader(path)`` (a Reader-like object)."""
    _IN_PLACE_READERS.append((module, predicate, reader))


# Delta checkpoints (FORMAT.md §11) are written and resolved by ``shardpoint.delta``, a layer
# above this one: ``shardpoint/__init__`` declares its module, and ``save_file(delta=True)`` and
# ``open`` (on a checkpoint whose metadata names a delta table) import it on first use.
_DELTA: list[str] = []


def declare_delta(module: str) -> None:
    """Let ``save_file(..., delta=True)`` and ``open`` use ``module.save_delta`` and
    ``module.as_delta_reader``."""
    _DELTA[:] = [module]


def delta_hook(name: str) -> Callable[..., Any]:
    """The declared delta module's function ``name``."""
    if not _DELTA:
        raise InvalidArgumentError("delta checkpoints need shardpoint.delta (import shardpoint)")
    fn: Callable[..., Any] = getattr(importlib.import_module(_DELTA[0]), name)
    return fn


def with_delta(reader: Any) -> Any:
    """``reader`` itself, or the delta module's reader over it when the checkpoint's metadata
    names a delta table (a substring test of the metadata text first: no JSON is parsed for other checkpoints)."""
    if _DELTA and "shardpoint.delta" in reader._core.metadata_json():
        return delta_hook("as_delta_reader")(reader)
    return reader
