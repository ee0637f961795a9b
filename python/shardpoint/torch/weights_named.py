"""A checkpoint's model weights under the names the model gives them, for the serving routes
(vLLM's and SGLang's loaders): a ``ShardpointTrainer`` checkpoint saved with
``shardpoint_weights="compressed"`` keeps its weights in its part (``checkpoint-N/shardpoint``)
under ``model/<name>``, beside nothing else (or, in earlier versions, beside the optimizer's
and RNG states); a serving engine's ``load_weights`` wants ``<name>``.

Why here and not in each engine's loader: the same rule serves vLLM and SGLang, and it reads
only metadata the trainer integration wrote (``shardpoint.integration``, a key of the format's
metadata, FORMAT.md §3), so it needs nothing above this layer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from .. import storage
from ..errors import InvalidArgumentError
from .weights import WeightsIterator, weights_iterator

__all__ = ["TRAINER_MODEL", "model_weights_iterator", "trainer_model_keys"]

#: where a trainer checkpoint's part keeps the model's weights
TRAINER_MODEL = "model/"
#: the metadata key naming the integration that wrote a checkpoint (``integrations._state``)
_WRITER_KEY = "shardpoint.integration"
_TRAINERS = ("hf_trainer",)


def trainer_model_keys(prefix: str | os.PathLike[str]) -> bool:
    """Whether checkpoint ``prefix`` is a trainer checkpoint's part holding its model's
    weights under ``model/`` (a part of any other integration raises
    :class:`InvalidArgumentError`: its weights are not one model's, by name)."""
    with storage.open(prefix) as r:
        writer = r.metadata.get(_WRITER_KEY)
        if writer is None:
            return False
        if writer not in _TRAINERS:
            raise InvalidArgumentError(
                f"{os.fspath(prefix)}: a {writer} checkpoint, not a model's weights: export its "
                "model first (`shardpoint export`, or save_pretrained)"
            )
        return any(k.startswith(TRAINER_MODEL) for k in r.keys())


class _Stripped:
    """A :class:`WeightsIterator` over ``model/<name>`` keys handing out ``<name>``; its other
    attributes (``bytes_read``, ``raw_bytes``, ``close``...) are the iterator's."""

    def __init__(self, inner: WeightsIterator) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._inner:
            yield name[len(TRAINER_MODEL) :], tensor

    def __enter__(self) -> _Stripped:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def model_weights_iterator(
    prefix: str | os.PathLike[str], **options: Any
) -> WeightsIterator | _Stripped:
    """:func:`weights_iterator` over ``prefix`` (``options`` are its own), the model's names
    handed out: a trainer checkpoint's part gives its ``model/`` weights without the
    ``model/``; any other checkpoint its tensors as stored."""
    if not trainer_model_keys(prefix):
        return weights_iterator(prefix, **options)
    return _Stripped(
        weights_iterator(prefix, names=lambda n: n.startswith(TRAINER_MODEL), **options)
    )
