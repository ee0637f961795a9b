"""A content-sniffing reader in front of Lightning's checkpoint loader.

Lightning reads every checkpoint file through one function,
``lightning.fabric.utilities.cloud_io._load`` (``pl_load``): ``TorchCheckpointIO.load_checkpoint``
and ``LightningModule/LightningDataModule.load_from_checkpoint`` call it, and it is what
``Fabric.load`` and ``Trainer.fit(ckpt_path=...)`` reach without a plugin. The classmethods give
no hook for a ``CheckpointIO``, so :func:`install` puts a reader in front of that function, in
each module that bound it (``from ... import _load as pl_load`` binds it once, at import): a
file shardpoint wrote (recognised by content: the single file's first bytes, the directory
form of earlier versions, an object-store checkpoint prefix) is read by shardpoint; every
other path, URL or file object goes to the function that was there before, unchanged.

Guarded: installed only for Lightning versions whose loader it was tested against (the 2.6
series; tests run against the installed release) and whose loader still has the expected
parameters. Otherwise nothing is replaced, and a warning says what to use instead. An upstream
hook would make this unnecessary: ``load_from_checkpoint(..., checkpoint_io=...)`` (as
``Trainer`` takes ``plugins=``), or a registry of loaders keyed by a file's first bytes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from . import _lightning_files as lf

__all__ = ["install", "installed"]

#: Lightning releases whose loader the reader was tested against: [low, high).
TESTED = ((2, 6), (2, 7))
#: The modules binding the loader, per distribution: (package, [(module, attribute)]).
_SITES = (
    (
        "lightning",
        (
            ("lightning.fabric.utilities.cloud_io", "_load"),
            ("lightning.fabric.plugins.io.torch_io", "pl_load"),
            ("lightning.pytorch.core.saving", "pl_load"),
        ),
    ),
    (
        "pytorch_lightning",
        (
            ("lightning_fabric.utilities.cloud_io", "_load"),
            ("lightning_fabric.plugins.io.torch_io", "pl_load"),
            ("pytorch_lightning.core.saving", "pl_load"),
        ),
    ),
)
_PARAMS = ("path_or_url", "map_location", "weights_only")
_MARK = "__shardpoint_reader__"
_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _version(package: str) -> tuple[int, ...]:
    text = getattr(sys.modules[package], "__version__", None)
    if text is None:  # mid-import (the startup hook runs while `lightning` still imports)
        from importlib import metadata

        try:
            text = metadata.version(package)
        except metadata.PackageNotFoundError:
            text = "0"
    text = str(text)
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _front(fallback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fallback)
    def _load(path_or_url: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
        if lf.is_checkpoint(path_or_url):
            return lf.load(path_or_url, map_location)
        return fallback(path_or_url, map_location=map_location, weights_only=weights_only)

    setattr(_load, _MARK, fallback)
    return _load


def _refuse(package: str, why: str, quiet: bool = False) -> None:
    if package not in _WARNED and not quiet:
        _WARNED.add(package)
        warnings.warn(
            f"shardpoint: {why}; {package}'s load_from_checkpoint and TorchCheckpointIO will "
            "not read shardpoint checkpoints (the plugin still saves and resumes). Use "
            "shardpoint.integrations.lightning.load_from_checkpoint(MyModel, path) or the "
            "ShardpointLoadable mixin",
            stacklevel=3,
        )


def installed() -> bool:
    """Whether the reader fronts an imported Lightning distribution's loader."""
    for _, sites in _SITES:
        module, attr = sites[0]
        mod = sys.modules.get(module)
        if mod is not None and hasattr(getattr(mod, attr, None), _MARK):
            return True
    return False


def install(*, quiet: bool = False) -> bool:
    """Front the loader of each imported Lightning distribution (``lightning`` and the
    standalone ``pytorch_lightning``) with the reader; idempotent. Whether ``lightning`` (or,
    without it, ``pytorch_lightning``) now reads shardpoint checkpoints. ``quiet``: no
    warning for an untested release (the import hook's call: files still load through
    ``torch.load``'s front)."""
    done = []
    with _LOCK:
        for package, sites in _SITES:
            if package not in sys.modules:
                continue
            version = _version(package)
            if not TESTED[0] <= version < TESTED[1]:
                _refuse(
                    package,
                    f"{package} {version} is not a release the reader was tested with",
                    quiet,
                )
                continue
            modules = [importlib.import_module(m) for m, _ in sites]
            base = getattr(modules[0], sites[0][1])
            base = getattr(base, _MARK, base)
            params = tuple(inspect.signature(base).parameters)
            if params != _PARAMS:
                _refuse(
                    package, f"{package}'s checkpoint loader takes {params}, not {_PARAMS}", quiet
                )
                continue
            for mod, (_, attr) in zip(modules, sites, strict=True):
                current = getattr(mod, attr)
                if not hasattr(current, _MARK):
                    setattr(mod, attr, _front(current))
            done.append(package)
    return bool(done)
