"""accelerate's own state-checkpointing tests, run with shardpoint's one line switched on.

``test_state_checkpointing.py`` beside this file is accelerate's ``tests/test_state_checkpointing.py``
copied unchanged (upstream header and assertions as they are) from huggingface/accelerate at
16cb6eb80dd9aa8b4df1a63ef57863e455d53b83 (1.15.0.dev0, the mirror's newest commit; the file is
the same there as at the v1.14.0 tag, and no v1.15.0 tag is in the mirror). The installed
accelerate is 1.15.0.

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
