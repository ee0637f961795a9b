"""vLLM loads shardpoint checkpoints: ``--load-format shardpoint`` and ``shardpoint_sharded``.

    pip install 'shardpoint[vllm]'         # registers the loaders through an entry point
    shardpoint export ./Llama-3-8B ./llama-sp             # or --tp 4 for per-rank pieces
    vllm serve ./llama-sp --load-format shardpoint [--model-loader-extra-config '{"threads": 16}']
    vllm serve ./llama-sp                                 # the default format reads it too
    vllm serve ./llama-sp --load-format shardpoint_sharded --tensor-parallel-size 4

``LLM(model="./llama-sp", load_format="shardpoint")`` is the same from Python. vLLM runs every
``vllm.general_plugins`` entry point in each of its processes before any work; ours is
:func:`register`, which may run any number of times. Without the entry point (a source
checkout), call ``shardpoint.vllm.register()`` before creating the engine.

This module imports without vLLM; the loader classes (:class:`ShardpointModelLoader`,
:class:`ShardpointShardedLoader`) import it when first used. See docs/SERVING.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "LOAD_FORMAT", "SHARDED_LOAD_FORMAT", "AUTO_LOAD_FORMAT",
           "ShardpointModelLoader", "ShardpointShardedLoader", "ShardpointAutoLoader"]  # fmt: skip

#: ``--load-format`` of the whole-model loader.
LOAD_FORMAT = "shardpoint"
#: ``--load-format`` of the per-rank (tensor-parallel pieces) loader.
SHARDED_LOAD_FORMAT = "shardpoint_sharded"
#: vLLM's default ``--load-format``: registered over vLLM's default loader with
#: ``ShardpointAutoLoader``, which reads a serving directory too (everything else unchanged).
AUTO_LOAD_FORMAT = "auto"


def register() -> None:
    """Register both load formats with vLLM (the ``vllm.general_plugins`` entry point).
    Re-entrant: registering again when our classes are already there does nothing."""
    _needs_vllm()
    from vllm.model_executor import model_loader

    from ._loader import ShardpointModelLoader, ShardpointShardedLoader

    table = getattr(model_loader, "_LOAD_FORMAT_TO_MODEL_LOADER", {})
    for name, cls in ((LOAD_FORMAT, ShardpointModelLoader),
                      (SHARDED_LOAD_FORMAT, ShardpointShardedLoader)):  # fmt: skip
        if table.get(name) is not cls:
            model_loader.register_model_loader(name)(cls)
    # "auto" (the default) reads a serving directory too; only over vLLM's own default loader
    # (never over another plugin's), and directly: register_model_loader warns on every
    # overwrite, in every vLLM process
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from ._loader import ShardpointAutoLoader

    if table.get(AUTO_LOAD_FORMAT) is DefaultModelLoader:
        table[AUTO_LOAD_FORMAT] = ShardpointAutoLoader


def _needs_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"shardpoint.vllm needs vLLM: pip install 'shardpoint[vllm]' ({e})"
        ) from e


def __getattr__(name: str) -> Any:
    if name in ("ShardpointModelLoader", "ShardpointShardedLoader", "ShardpointAutoLoader"):
        _needs_vllm()
        from . import _loader

        value = getattr(_loader, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardpoint.vllm' has no attribute {name!r}")
