"""SGLang loads shardpoint checkpoints: pass the loader class as the load format.

    import sglang as sgl
    from shardpoint.sglang import ShardpointModelLoader
    engine = sgl.Engine(model_path="./llama-sp", load_format=ShardpointModelLoader)

SGLang's ``get_model_loader`` instantiates a class given as ``load_format`` before it looks at
names; a *name* (``--load-format shardpoint`` on its command line) would have to pass SGLang's
closed ``LoadFormat`` enum, which has no supported extension point, so none is registered.
``model_loader_extra_config`` takes the same keys as vLLM's (``threads``, ``io``, ``window``,
``verify``). This module imports without SGLang; the class imports it when first used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShardpointModelLoader"]


def __getattr__(name: str) -> Any:
    if name == "ShardpointModelLoader":
        try:
            import sglang  # noqa: F401
        except ImportError as e:
            raise ImportError(
                f"shardpoint.sglang needs SGLang: pip install 'shardpoint[sglang]' ({e})"
            ) from e
        from ._loader import ShardpointModelLoader

        globals()[name] = ShardpointModelLoader
        return ShardpointModelLoader
    raise AttributeError(f"module 'shardpoint.sglang' has no attribute {name!r}")
