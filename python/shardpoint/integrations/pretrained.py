"""What ``cls.from_pretrained(path)`` returns for a model shardpoint wrote (the front
installed by ``_shardpoint_loaders/pretrained.py`` once transformers is imported).

Which reader, by what the path holds: a trainer checkpoint whose weights are in its shardpoint
part (``ShardpointTrainer(shardpoint_weights="compressed")``: ``shardpoint.index`` and no
``model.index``) → :func:`shardpoint.integrations.hf_trainer.from_pretrained`, which checks
every weight's crc32c; a serving directory (``shardpoint export``) or a converted checkpoint
prefix → :func:`shardpoint.hf.from_pretrained`.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import InvalidArgumentError
from ..hf import HUB_KEYWORDS
from ..hf import from_pretrained as hf_from_pretrained

__all__ = ["from_pretrained"]


def _is_trainer_checkpoint(path: str) -> bool:
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, "shardpoint.index"))
        and not os.path.isfile(os.path.join(path, "model.index"))
    )


def from_pretrained(
    cls: Any, path: str, model_args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``cls.from_pretrained(path, *model_args, **kwargs)`` for a shardpoint model (``cls``: an
    ``AutoModel*`` class or a concrete ``PreTrainedModel`` subclass)."""
    if model_args:
        raise InvalidArgumentError(
            f"{path}: positional model arguments are not supported when from_pretrained reads a "
            "shardpoint checkpoint; pass them as keywords (they override config attributes)"
        )
    if _is_trainer_checkpoint(path):
        from .hf_trainer import from_pretrained as trainer_from_pretrained

        rest = {k: v for k, v in kwargs.items() if k not in HUB_KEYWORDS}
        return trainer_from_pretrained(cls, path, **rest)
    return hf_from_pretrained(cls, path, **kwargs)
