"""Keras 3 models from TensorFlow checkpoints: the migration path off TensorFlow.

``restore_from_tensorflow(sp.Checkpoint(model=net, optimizer=opt), "tf_ckpts/")`` restores a
checkpoint written by ``tf.train.Checkpoint(model=..., optimizer=...)`` with a tf.keras model
(Keras 3 in TF >= 2.16, or tf_keras / Keras 2 with new-style or legacy optimizers) into the
equivalent Keras 3 model on JAX, PyTorch or any other backend, matching by object graph. No
TensorFlow is needed; see :mod:`shardpoint.convert.tf_checkpoint` for the format side.
"""

from __future__ import annotations

import os

from ..convert.tf_checkpoint import restore_from_tensorflow as _restore
from ..objgraph.load_status import CheckpointLoadStatus
from ..objgraph.trackable import Trackable, as_trackable

__all__ = ["restore_from_tensorflow"]


def restore_from_tensorflow(root: object, path: str | os.PathLike[str]) -> CheckpointLoadStatus:
    """Restore the TensorFlow checkpoint at ``path`` (a prefix, or a directory whose
    ``checkpoint`` file names the latest) into ``root``: an ``sp.Checkpoint`` with the same
    dependency names as the ``tf.train.Checkpoint`` that wrote it, or one Keras object whose
    graph is the checkpoint's root (rare). Layers and optimizers that are not built yet get
    their values when they build (first call, first ``apply_gradients``).

    Integer counters may change width (TF's int64 iterations into a JAX int32); floats are
    never cast. Hyper-parameters that tf.keras 2's legacy optimizers kept as variables
    (``beta_1``, ``rho`` ...) restore into the Keras 3 optimizer's floats; a non-zero legacy
    ``decay`` (no Keras 3 counterpart) raises.
    """
    tracked = as_trackable(root)
    if not isinstance(tracked, Trackable):
        raise TypeError(f"cannot restore into {type(root).__name__}: not trackable")
    return _restore(tracked, path)
