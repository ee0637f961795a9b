"""SGLang's default load format reading a serving directory ``shardpoint export`` wrote, in any
process where shardpoint is installed: ``python -m sglang.launch_server --model-path DIR``.

SGLang's ``--load-format`` is a closed enum, so its command line cannot name shardpoint's loader
(only the Python API takes the class: ``sgl.Engine(load_format=ShardpointModelLoader)``), and the
default ``auto`` said "Cannot find any model weights" for our directory. This front, installed
once ``sglang.srt.model_loader.loader`` has run (before the modules that import
``get_model_loader`` by name), answers ``get_model_loader`` with
``shardpoint.sglang.ShardpointModelLoader`` when the format is ``auto`` and the model path is a
directory holding our ``model.index`` and no weight files SGLang reads itself
(``*.safetensors``, ``*.bin``, ``*.pt``...). Every other call is SGLang's own.
``SHARDPOINT_TORCH_LOAD=0`` leaves it out.
"""

from __future__ import annotations

import os

from . import _MARK, INDEX_MAGIC, MAGIC, _starts_with, dress

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["is_serving_directory", "patch_loader"]

#: weight files SGLang's default loader reads itself
_NATIVE = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def is_serving_directory(path: Any) -> bool:
    """Whether ``path`` is a local directory holding our whole-model checkpoint
    (``model.index``) or a ``ShardpointTrainer`` checkpoint's part (``shardpoint.index``: its
    weights compressed there), and no weights SGLang reads itself (a trainer checkpoint's
    ``optimizer.pt`` or ``training_args.bin`` are our single files, not weights). Never
    raises."""
    try:
        if not isinstance(path, str | os.PathLike):
            return False
        p = os.fspath(path)
        if not isinstance(p, str) or not os.path.isdir(p):
            return False
        for n in os.listdir(p):
            if n.endswith(_NATIVE) and not _starts_with(os.path.join(p, n), MAGIC):
                return False
        return any(
            _starts_with(os.path.join(p, part + ".index"), INDEX_MAGIC)
            for part in ("model", "shardpoint")
        )
    except (OSError, ValueError, TypeError):
        return False


def _front(original: Callable[..., Any], enabled: Callable[[], bool]) -> Callable[..., Any]:
    def get_model_loader(load_config: Any, model_config: Any = None, *args: Any, **kw: Any) -> Any:
        fmt = getattr(load_config, "load_format", None)
        if (
            model_config is not None
            and str(getattr(fmt, "value", fmt)).lower() == "auto"
            and enabled()
            and is_serving_directory(getattr(model_config, "model_path", None))
        ):
            from shardpoint.sglang import ShardpointModelLoader

            return ShardpointModelLoader(load_config)
        return original(load_config, model_config, *args, **kw)

    dress(get_model_loader, original)
    return get_model_loader


def patch_loader(module: ModuleType, enabled: Callable[[], bool]) -> None:
    """Front ``get_model_loader`` (and rebind it where SGLang's modules imported it by name
    already: only when the hook was installed after SGLang was imported)."""
    import sys

    current = getattr(module, "get_model_loader", None)
    if current is None or hasattr(current, _MARK):
        return
    front = _front(current, enabled)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("sglang") and (
            getattr(mod, "get_model_loader", None) is current
        ):
            mod.get_model_loader = front  # type: ignore[attr-defined]
    module.get_model_loader = front  # type: ignore[attr-defined]
