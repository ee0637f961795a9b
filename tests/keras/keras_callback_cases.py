"""ShardpointCheckpoint (the Keras callback) on this process's backend; run by
test_keras_backends.py once per backend."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import shardpoint as sp
from shardpoint.keras import ShardpointCheckpoint


def make_model(seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((32, 3)).astype(np.float32), rng.standard_normal((32, 1)).astype(
        np.float32
    )


def weights(model):
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


def test_saves_every_n_batches_in_the_background(tmp_path):
    x, y = data()
    model = make_model()
    callback = ShardpointCheckpoint(tmp_path / "ck", save_freq=2, max_to_keep=2)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    manager = callback.manager
    assert manager is not None
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-6", "ckpt-8"]
    assert sp.latest_checkpoint(str(tmp_path / "ck")) == manager.latest_checkpoint
    keys = dict(sp.list_variables(manager.latest_checkpoint))
    # the weights are named through the optimizer, the shortest path (breadth-first, as
    # TensorFlow names them too: see fixtures/keys_keras3.json, "compiled_fit")
    assert keys["optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"] == [3, 4]
    assert keys["optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE"] == [3, 4]
    with sp.load_checkpoint(manager.latest_checkpoint) as reader:
        assert int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")) == 8
        assert int(reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")) == 8
        saved = reader.get_tensor("optimizer/_trainable_variables/3/.ATTRIBUTES/VARIABLE_VALUE")
    np.testing.assert_array_equal(saved, weights(model)[-1])
    # ckpt-6, saved in the background while batches 7-8 trained, holds the values of batch 6
    reference = make_model()
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    reference.fit(x[:16], y[:16], batch_size=8, epochs=1, shuffle=False, verbose=0)
    restored = make_model(seed=5)
    status = sp.Checkpoint(model=restored, optimizer=restored.optimizer).read(
        manager.checkpoints[0]
    )
    status.expect_partial()  # the step counter is not part of this program
    restored.optimizer.build(restored.trainable_variables)
    for a, b in zip(weights(restored), weights(reference), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(keras.ops.convert_to_numpy(restored.optimizer.iterations.value)) == 6


def test_resume_after_interruption_equals_an_uninterrupted_fit(tmp_path):
    x, y = data()
    reference = make_model()
    reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    first = make_model()
    first.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[ShardpointCheckpoint(tmp_path / "ck", blocking=True)],
    )
    resumed = make_model(seed=99)  # different initial weights: all of them must be restored
    callback = ShardpointCheckpoint(tmp_path / "ck", restore=True)
    resumed.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert callback.restore_status is not None
    callback.restore_status.assert_consumed()
    for a, b in zip(weights(resumed), weights(reference), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations.value)) == 12
    assert [os.path.basename(p) for p in callback.manager.checkpoints][-1] == "ckpt-12"


def test_bad_save_freq_is_refused(tmp_path):
    with pytest.raises(ValueError, match="save_freq"):
        ShardpointCheckpoint(tmp_path, save_freq=0)
