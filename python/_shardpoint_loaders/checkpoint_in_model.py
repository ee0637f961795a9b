"""accelerate's ``load_checkpoint_in_model`` (and ``load_checkpoint_and_dispatch``, which calls
it) reading the models shardpoint wrote, in any process where shardpoint is installed.

A user exports a model for serving (``shardpoint export SRC DIR``) or trains with
``shardpoint_weights="compressed"``; their next script builds the model under
``init_empty_weights()`` and calls ``load_checkpoint_and_dispatch(model, DIR,
device_map="auto")``, and accelerate says "DIR is not a folder containing a `.index.json` file
or a pytorch_model.bin or a model.safetensors file", never "shardpoint".

Two fronts, installed once ``accelerate.utils.modeling`` has run (standard library only until
a path turns out to be ours):

- ``load_checkpoint_in_model``: a directory accelerate cannot read itself (no
  ``pytorch_model.bin``, ``model.safetensors`` or ``*.index.json``; the rule of the
  transformers front, :func:`.pretrained.is_pretrained`) holding one of our checkpoints, or a
  checkpoint prefix of ours, is handed on as the path of its ``.index`` file;
- ``load_state_dict``: the path of one of our ``.index`` files reads the model's weights
  (``shardpoint.integrations.loaders.model_weights``).

So accelerate's own loop places every weight (``device_map``, ``dtype``,
``keep_in_fp32_modules``, disk offload, ``strict``, tied parameters) exactly as it does for a
``pytorch_model.bin``. Every other argument reaches accelerate's functions unchanged.
"""

from __future__ import annotations

import os

from . import _MARK, INDEX_MAGIC, _starts_with, dress
from .pretrained import is_pretrained, refuse_lost_index

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any, TypeGuard

__all__ = ["index_of", "patch_modeling"]

#: the parts a directory's checkpoint may be (a serving directory's; a trainer checkpoint's)
_PARTS = ("model", "shardpoint")


def _is_our_index(path: Any) -> TypeGuard[str | os.PathLike[str]]:
    return (
        isinstance(path, str | os.PathLike)
        and os.fspath(path).endswith(".index")
        and _starts_with(os.fspath(path), INDEX_MAGIC)
    )


def index_of(checkpoint: Any) -> str | None:
    """The ``.index`` file accelerate should be handed for ``checkpoint``, or ``None`` when
    ``checkpoint`` is not one of ours that accelerate cannot read itself. Never raises."""
    try:
        if _is_our_index(checkpoint):
            return os.fspath(checkpoint)
        if not is_pretrained(checkpoint):
            return None
        p = os.fspath(checkpoint)
        if not os.path.isdir(p):
            return p + ".index"
        for part in _PARTS:
            if _is_our_index(os.path.join(p, part + ".index")):
                return os.path.join(p, part + ".index")
        # only tensor-parallel pieces: shardpoint's reader names them in its error
        return os.path.join(p, "model.index")
    except (OSError, ValueError, TypeError):
        return None


def _refused(path: Any, env: str) -> ValueError:
    return ValueError(
        f"{os.fspath(path)!r} is a shardpoint checkpoint, and accelerate's reading of "
        f"shardpoint checkpoints is turned off ({env}=0): read its weights with "
        "shardpoint.integrations.loaders.model_weights(path) and load_state_dict, or unset "
        f"{env}"
    )


def _checkpoint_front(
    original: Callable[..., Any], enabled: Callable[[], bool], env: str
) -> Callable[..., Any]:
    def load_checkpoint_in_model(*args: Any, **kwargs: Any) -> Any:
        given = args[1] if len(args) > 1 else kwargs.get("checkpoint")
        index = index_of(given)
        if index is None:
            if enabled():  # accelerate's own words: "not a folder containing ..." (ValueError)
                refuse_lost_index(given, "load_checkpoint_in_model", corrupt=True)
            return original(*args, **kwargs)
        if not enabled():
            raise _refused(given, env)
        if len(args) > 1:
            args = (args[0], index, *args[2:])
        else:
            kwargs = {**kwargs, "checkpoint": index}
        return original(*args, **kwargs)

    dress(load_checkpoint_in_model, original)
    return load_checkpoint_in_model


def _state_front(
    original: Callable[..., Any], enabled: Callable[[], bool], env: str
) -> Callable[..., Any]:
    def load_state_dict(*args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("checkpoint_file")
        if not _is_our_index(given):
            return original(*args, **kwargs)
        if not enabled():
            raise _refused(given, env)
        from shardpoint.integrations.loaders import model_weights

        return model_weights(given)

    dress(load_state_dict, original)
    return load_state_dict


def patch_modeling(module: ModuleType, enabled: Callable[[], bool], env: str) -> None:
    """Front ``load_checkpoint_in_model`` and ``load_state_dict`` of
    ``accelerate.utils.modeling``, and rebind them where accelerate's modules imported them
    by name already (``accelerate.utils``, ``accelerate.big_modeling``: only when the hook
    was installed after accelerate was imported)."""
    import sys

    for name, make in (
        ("load_checkpoint_in_model", _checkpoint_front),
        ("load_state_dict", _state_front),
    ):
        current = getattr(module, name, None)
        if current is None or hasattr(current, _MARK):
            continue
        front = make(current, enabled, env)
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("accelerate") and (
                getattr(mod, name, None) is current
            ):
                setattr(mod, name, front)
        setattr(module, name, front)
