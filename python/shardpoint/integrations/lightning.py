"""PyTorch Lightning: ``Trainer(plugins=[ShardpointCheckpointIO()])``.

Every checkpoint Lightning writes (``ModelCheckpoint``, ``trainer.save_checkpoint``) becomes
one file at the path Lightning chose (``epoch=0-step=10.ckpt``): the single-file form
(FORMAT.md §10) of the whole dict Lightning builds (``state_dict``, ``optimizer_states``,
``lr_schedulers``, ``loops``, ``callbacks``, ``hyper_parameters``...), compressed, checksummed
and never pickled. Object-store URLs (``s3://``...) are written by the core; other fsspec URLs
(``memory://``...) through fsspec.

Constructing the plugin puts a content-sniffing reader in front of Lightning's checkpoint
loader, so ``LightningModule.load_from_checkpoint``, ``LightningDataModule.load_from_checkpoint``
and ``Fabric.load`` read shardpoint files too, and every other file as before
(``_lightning_reader``; a script that only loads calls :func:`install_reader`). Lightning's own
``.ckpt`` files load through the plugin with ``torch.load(weights_only=True)``.
``ShardpointTiers(directory, local_directory=...)``, a callback, turns the multi-tier
checkpoints on (docs/TIERS.md): a node-local tier every few steps, peer replicas, a persistent
tier every many steps, and ``fit`` resuming from the cheapest tier by itself.
Importing this module does not import Lightning.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._lightning_io import ShardpointCheckpointIO
    from ._lightning_tiers import ShardpointTiers

# The CheckpointIO subclass lives in _lightning_io (it imports Lightning); it is loaded on first
# use of the name, so that this module imports without Lightning.
_LAZY = {"ShardpointCheckpointIO": "._lightning_io", "ShardpointTiers": "._lightning_tiers"}


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
    "ShardpointTiers",
    "install_reader",
    "load_checkpoint",
    "load_from_checkpoint",
]


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


def install_reader() -> bool:
    """Let Lightning's checkpoint loader read shardpoint files (what constructing
    :class:`ShardpointCheckpointIO` does), for scripts that only load:
    ``MyModel.load_from_checkpoint(path)``, ``Fabric.load``. Returns whether it is installed
    (``False``, with a warning, for Lightning releases it was not tested with)."""
    _lightning()
    from ._lightning_reader import install

    return install()


def load_checkpoint(
    path: str | os.PathLike[str], map_location: Any = None, *, into: Any = None
) -> dict[str, Any]:
    """The checkpoint dict at ``path``, as ``torch.load`` of a native ``.ckpt`` returns it:
    a file (or directory, from earlier versions) written by :class:`ShardpointCheckpointIO`,
    or Lightning's own file read with ``torch.load(weights_only=True)``.
    ``into``: live tensors nested as the checkpoint (``{"state_dict": module.state_dict()}``)
    that receive their stored values in place and stand in the result for them."""
    from . import _lightning_files

    return _lightning_files.load(path, map_location, into=into)


def load_from_checkpoint(
    cls: type,
    checkpoint_path: str | os.PathLike[str],
    map_location: Any = None,
    strict: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``cls.load_from_checkpoint(checkpoint_path, ...)`` without Lightning's loader: builds
    the module (or datamodule) from the saved ``hyper_parameters`` (``kwargs`` override them)
    with Lightning's own instantiation rules, calls its ``on_load_checkpoint`` and loads the
    ``state_dict`` (``strict`` as Lightning's)."""
    pl = _lightning()
    from lightning.pytorch.core import saving  # the instantiation rules Lightning itself uses

    checkpoint = load_checkpoint(checkpoint_path, map_location)
    # a LightningModule/DataModule class attribute; mypy sees `cls` as the plain type it is given
    hparams_key = cls.CHECKPOINT_HYPER_PARAMS_KEY  # type: ignore[attr-defined]
    checkpoint.setdefault(hparams_key, {})
    checkpoint[hparams_key] = dict(checkpoint[hparams_key])
    checkpoint[hparams_key].update(kwargs)
    if issubclass(cls, pl.LightningDataModule):
        return saving._load_state(cls, checkpoint, **kwargs)
    return saving._load_state(cls, checkpoint, strict=strict, **kwargs)


class ShardpointLoadable:
    """Mixin for a ``LightningModule``: ``MyModel.load_from_checkpoint(path)`` reads
    shardpoint checkpoints even where no plugin was constructed in the process, and anything
    else as Lightning does. (With the reader installed, Lightning's own classmethod already
    does; the mixin installs it.)

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
        parent: Any = super()
        if not install_reader() and _is_ours(checkpoint_path):
            if hparams_file is not None:
                raise TypeError(
                    "hparams_file is not supported for shardpoint checkpoints on this "
                    "Lightning release: pass the hyper-parameters to override as keyword "
                    "arguments"
                )
            return load_from_checkpoint(cls, checkpoint_path, map_location, strict, **kwargs)
        return parent.load_from_checkpoint(
            checkpoint_path,
            map_location=map_location,
            hparams_file=hparams_file,
            strict=strict,
            **kwargs,
        )


def _is_ours(path: Any) -> bool:
    from . import _lightning_files

    return _lightning_files.is_checkpoint(path)
