"""Conversions between shardpoint and other checkpoint formats.

Sources (read): shardpoint, safetensors, PyTorch ``torch.save`` files (``.pt``/``.bin``/``.pth``),
TensorFlow checkpoints (``P.index`` + ``P.data-*``, read without TensorFlow), Hugging Face
sharded safetensors directories (``model.safetensors.index.json`` + shards).
Sinks (written): shardpoint (streamed through :class:`shardpoint.Writer`), safetensors, and
Hugging Face directories (``to="hf"``, split and named as ``huggingface_hub`` does).

Formats are told apart by content, not only by name: a shardpoint index starts with
``SPINDEX\\0``, a TensorFlow index ends with the LevelDB table magic, a safetensors file starts
with an 8-byte header length followed by ``{``, a PyTorch file is a zip archive or a pickle.

>>> from shardpoint.convert import convert
>>> convert("model.safetensors", "ckpt/model")            # doctest: +SKIP
>>> convert("ckpt/model", "roundtrip.safetensors")         # doctest: +SKIP

The names below live in :mod:`.dispatch`, imported on the first one asked for (PEP 562):
importing one submodule (``shardpoint.convert.hf``, which every Hugging Face read needs) no
longer imports the TensorFlow, torch-file and export code with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dispatch import (
        SINK_FORMATS,
        ConvertResult,
        Source,
        Spec,
        TensorBundleReader,
        convert,
        detect_format,
        export_hf,
        open_source,
        resolve_prefix,
    )
    from .dispatch import (
        is_hf_path as is_hf_path,
    )
    from .dispatch import (
        is_manager_url as is_manager_url,
    )

__all__ = [
    "convert",
    "open_source",
    "detect_format",
    "resolve_prefix",
    "ConvertResult",
    "Source",
    "Spec",
    "TensorBundleReader",
    "SINK_FORMATS",
    "export_hf",
]


def __getattr__(name: str) -> Any:
    """A name of :mod:`.dispatch` (imported now), or a submodule it imported."""
    if name.startswith("__") or name == "dispatch":  # dispatch: being imported (a cycle)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    dispatch = importlib.import_module(".dispatch", __name__)
    if hasattr(dispatch, name):
        return getattr(dispatch, name)
    if name in globals():  # a submodule that importing dispatch bound on this package
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
