"""PyTorch Lightning: ``Trainer(plugins=[ShardpointCheckpointIO()])``.

Every checkpoint Lightning writes (``ModelCheckpoint``, ``trainer.save_checkpoint``) becomes a
directory named as Lightning names the file (``epoch=0-step=10.ckpt/``) holding one shardpoint
checkpoint ``state.index`` + ``state.data-*``: the whole dict Lightning builds (``state_dict``,
``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``, ``hyper_parameters``...)
compressed, checksummed and never pickled. ``ckpt_path=`` a directory or ``"last"`` resumes
through :meth:`ShardpointCheckpointIO.load_checkpoint`; ``ModelCheckpoint(save_top_k=...)``
deletes through :meth:`ShardpointCheckpointIO.remove_checkpoint`.

``LightningModule.load_from_checkpoint`` reads with ``torch.load`` and cannot be redirected to
a plugin: use :func:`load_from_checkpoint` (``load_from_checkpoint(MyModel, path)``) or mix
:class:`ShardpointLoadable` into the module (``MyModel.load_from_checkpoint(path)`` then reads
both our directories and Lightning's files). Importing this module does not import Lightning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, NotFoundError
from ._state import load_tree, part_prefix

if TYPE_CHECKING:
    from ._lightning_io import ShardpointCheckpointIO

# The CheckpointIO subclass lives in _lightning_io (it imports Lightning); it is loaded on first
# use of the name, so that this module imports without Lightning.
_LAZY = {"ShardpointCheckpointIO": "._lightning_io"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _lightning()  # the clear ImportError first
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __package__), name)
    globals()[name] = value
    return value


__all__ = [
    "ShardpointCheckpointIO",
    "ShardpointLoadable",
    "load_checkpoint",
    "load_from_checkpoint",
]

_PART = "state"
_NAME = "lightning"


def _lightning() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError as exc:
            raise ImportError(
                "shardpoint.integrations.lightning needs Lightning: "
                "pip install 'shardpoint[lightning]'"
            ) from exc
    return pl


def _device(map_location: Any) -> Any:
    """Where tensors go: a device name or ``torch.device``; CPU for ``None`` and for callables
    or dicts (torch.load's remapping hooks, which need pickled storages to act on)."""
    import torch

    if isinstance(map_location, str | torch.device):
        return map_location
    return "cpu"


def load_checkpoint(
    path: str | os.PathLike[str], map_location: Any = None, *, into: Any = None
) -> dict[str, Any]:
    """The checkpoint dict Lightning saved at ``path`` (a directory written by
    :class:`ShardpointCheckpointIO`), as ``torch.load`` of a native ``.ckpt`` returns it.
    ``into``: live tensors nested as the checkpoint (``{"state_dict": module.state_dict()}``)
    that receive their stored values in place and stand in the result for them."""
    p = Path(path)
    if p.is_file():
        raise InvalidArgumentError(
            f"lightning: {str(p)!r} is a file, not a shardpoint checkpoint directory (it was "
            "written by Lightning's own TorchCheckpointIO; load it with torch.load or drop "
            "ShardpointCheckpointIO for it)"
        )
    if not p.exists():
        raise NotFoundError(f"lightning: no checkpoint at {str(p)!r}")
    tree = load_tree(
        part_prefix(p, _PART), integration=_NAME, device=_device(map_location), into=into
    )
    return dict(tree)


def load_from_checkpoint(
    cls: type,
    checkpoint_path: str | os.PathLike[str],
    map_location: Any = None,
    strict: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``cls.load_from_checkpoint(checkpoint_path, ...)`` for a checkpoint directory written by
    :class:`ShardpointCheckpointIO`: builds the module (or datamodule) from the saved
    ``hyper_parameters`` (``kwargs`` override them), calls its ``on_load_checkpoint`` and loads
    the ``state_dict`` (``strict`` as Lightning's)."""
    pl = _lightning()
    from lightning.pytorch.core import saving  # the instantiation rules Lightning itself uses

    checkpoint = load_checkpoint(checkpoint_path, map_location)
    hparams_key = cls.CHECKPOINT_HYPER_PARAMS_KEY  # type: ignore[attr-defined]
    checkpoint.setdefault(hparams_key, {})
    checkpoint[hparams_key] = dict(checkpoint[hparams_key])
    checkpoint[hparams_key].update(kwargs)
    if issubclass(cls, pl.LightningDataModule):
        return saving._load_state(cls, checkpoint, **kwargs)
    return saving._load_state(cls, checkpoint, strict=strict, **kwargs)


class ShardpointLoadable:
    """Mixin for a ``LightningModule``: ``MyModel.load_from_checkpoint(path)`` reads a
    directory written by :class:`ShardpointCheckpointIO`, and anything else as Lightning does.

    ``class MyModel(ShardpointLoadable, L.LightningModule): ...``
    """

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: Any,
        map_location: Any = None,
        hparams_file: Any = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        if isinstance(checkpoint_path, str | os.PathLike) and os.path.isdir(checkpoint_path):
            if hparams_file is not None:
                raise InvalidArgumentError(
                    "hparams_file is not supported for shardpoint checkpoints: pass the "
                    "hyper-parameters to override as keyword arguments"
                )
            return load_from_checkpoint(cls, checkpoint_path, map_location, strict, **kwargs)
        parent: Any = super()
        return parent.load_from_checkpoint(
            checkpoint_path,
            map_location=map_location,
            hparams_file=hparams_file,
            strict=strict,
            **kwargs,
        )
