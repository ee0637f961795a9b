"""accelerate's own state-checkpointing tests, run with shardpoint's one line switched on.

``test_state_checkpointing.py`` and ``test_accelerator.py`` beside this file are accelerate's
``tests/test_state_checkpointing.py`` and ``tests/test_accelerator.py`` of the v1.16.0 release,
copied unchanged (upstream header and assertions as they are). The mirror of
huggingface/accelerate has no v1.16.0 tag (its newest tag is v1.14.0, its main 16cb6eb80dd9 is
1.15.0.dev0), so they come from the released source distribution, which carries ``tests/``:
accelerate-1.16.0.tar.gz, sha256
43c446b9affb145220946a63fe32e14e968fcfca645d25b5f1f3fdbc375657ae (its ``src/accelerate`` is the
1.16.0 wheel's, file for file). They need accelerate 1.16: ``test_state_checkpointing.py``
imports ``get_torch_accelerator_backend`` (new in 1.16) and ``test_accelerator.py`` calls
``Accelerator._remap_optimizer_parameters`` (new in 1.16), hence ``accelerate>=1.16`` in
requirements-extras.txt. The copies before (1.15.0.dev0, 16cb6eb80dd9) imported
``FP8RecipeKwargs``, which 1.16 removed.

The one line a user changes is ``Accelerator(...)`` -> ``ShardpointAccelerator(...)``. Here it is
``accelerate.Accelerator`` replaced by ``ShardpointAccelerator`` while the module is imported (it
binds ``Accelerator`` at import) and during each of its tests; every other test module of the
suite keeps the real class. ``SHARDPOINT_UPSTREAM_NATIVE=1`` leaves the switch off, to count the
native results.
"""

from __future__ import annotations

import importlib
import os

import accelerate
import pytest

_NATIVE = os.environ.get("SHARDPOINT_UPSTREAM_NATIVE") == "1"


def _shardpoint_accelerator() -> type:
    from shardpoint.integrations.accelerate import ShardpointAccelerator

    return ShardpointAccelerator


#: the upstream modules of this folder; each binds ``Accelerator`` when it is imported
#: (``from accelerate import Accelerator``, ``from accelerate.accelerator import Accelerator``)
_MODULES = ("test_state_checkpointing", "test_accelerator")


def _import_switched() -> None:
    import accelerate.accelerator as where

    real = accelerate.Accelerator
    accelerate.Accelerator = where.Accelerator = _shardpoint_accelerator()  # type: ignore[misc]
    try:
        for name in _MODULES:
            importlib.import_module(f"{__package__}.{name}")
    finally:
        accelerate.Accelerator = where.Accelerator = real  # type: ignore[misc]


if not _NATIVE:
    _import_switched()


@pytest.fixture(autouse=True)
def _one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _NATIVE:
        monkeypatch.setattr(accelerate, "Accelerator", _shardpoint_accelerator())
