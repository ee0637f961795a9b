"""Keras 3 objects (layers, models, optimizers, variables) in ``sp.Checkpoint`` object graphs,
on any Keras backend (JAX, PyTorch, TensorFlow, numpy), without TensorFlow.

Importing this package registers the adapters (:mod:`.adapters`); ``import shardpoint`` does it
on demand the first time a Keras object is tracked. See docs/KERAS.md.
"""

from __future__ import annotations

from .adapters import (
    KerasContainerAdapter,
    KerasObjectAdapter,
    KerasVariableAdapter,
    register,
    run_deferred_restores,
)
from .callback import ShardpointCheckpoint
from .tf_import import restore_from_tensorflow

register()

__all__ = [
    "ShardpointCheckpoint",
    "KerasContainerAdapter",
    "KerasObjectAdapter",
    "KerasVariableAdapter",
    "register",
    "restore_from_tensorflow",
    "run_deferred_restores",
]
