"""Keras 3's numpy backend (inference only, no training): layers and models are trackables there
too. Run by test_keras_backends.py with KERAS_BACKEND=numpy."""

from __future__ import annotations

import keras
import numpy as np

import shardpoint as sp


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.l1 = keras.layers.Dense(5)
        self.blocks = [keras.layers.Dense(3), keras.layers.LayerNormalization()]

    def call(self, x):
        x = self.l1(x)
        for block in self.blocks:
            x = block(x)
        return x


def test_numpy_backend_round_trip_with_deferred_restore(tmp_path):
    assert keras.backend.backend() == "numpy"
    x = np.ones((2, 4), np.float32)
    src = Net()
    expected = keras.ops.convert_to_numpy(src(x))
    path = sp.Checkpoint(net=src).write(tmp_path / "net")
    keys = {k for k, _ in sp.list_variables(path)}
    assert {
        "net/l1/_kernel/.ATTRIBUTES/VARIABLE_VALUE",
        "net/blocks/0/bias/.ATTRIBUTES/VARIABLE_VALUE",
        "net/blocks/1/gamma/.ATTRIBUTES/VARIABLE_VALUE",
    } <= keys
    dst = Net()
    status = sp.Checkpoint(net=dst).read(path)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dst(x)), expected)
    status.assert_consumed()
