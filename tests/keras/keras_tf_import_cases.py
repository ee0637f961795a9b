"""TensorFlow-written checkpoints (golden fixtures from fixtures/make_tf_fixtures.py) restored
into Keras 3 models on this process's backend (run by test_keras_backends.py per backend).

Each fixture is a two-layer model after 3 Adam steps in TensorFlow, saved by a
``tf.train.CheckpointManager``; the JSON beside it holds every saved value and the losses of the
uninterrupted TF run. Restoring and training 3 more steps here must reproduce TF's losses for
steps 4-6: step 4 checks the weights, steps 5-6 the optimizer state (moments, iteration count).
"""

from __future__ import annotations

import json
import os
import shutil

import keras
import numpy as np
import pytest

import shardpoint as sp
from shardpoint.keras import restore_from_tensorflow

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


class MLP(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x))


def batches():
    rng = np.random.default_rng(7)  # the fixture script's data
    x = rng.standard_normal((6, 4, 3)).astype(np.float32)
    y = rng.standard_normal((6, 4, 2)).astype(np.float32)
    return x, y


def sequential():
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation="relu"),
            keras.layers.Dropout(0.0),
            keras.layers.Dense(2),
        ]
    )


def program(flavour="keras3"):
    net = sequential() if flavour == "tfkeras2_sequential" else MLP()
    opt = keras.optimizers.Adam(0.05)
    net.compile(optimizer=opt, loss="mse")
    step = keras.Variable(0, dtype="int64", trainable=False, name="step")
    return net, opt, step, sp.Checkpoint(step=step, model=net, optimizer=opt)


def on_cpu(variable):
    value = variable.value
    if keras.backend.backend() == "jax":
        return all(d.platform == "cpu" for d in value.devices())
    device = getattr(value, "device", "cpu")
    return str(device).startswith("cpu")


def numpy(v):
    return keras.ops.convert_to_numpy(v.value if hasattr(v, "value") else v)


@pytest.mark.parametrize(
    "flavour", ["keras3", "tfkeras2_new", "tfkeras2_legacy", "tfkeras2_sequential"]
)
def test_tf_checkpoint_restores_and_training_continues(flavour):
    with open(os.path.join(FIXTURES, f"{flavour}.json")) as f:
        fixture = json.load(f)
    net, opt, step, ckpt = program(flavour)
    status = restore_from_tensorflow(ckpt, os.path.join(FIXTURES, flavour))  # the directory
    assert net.built == (flavour == "tfkeras2_sequential") and not opt.built
    x, y = batches()
    losses = [float(net.train_on_batch(x[i], y[i])) for i in range(3, 6)]
    if flavour == "tfkeras2_legacy":
        # legacy Adam puts epsilon outside the bias correction (Keras 3 inside): ~1e-6 apart
        np.testing.assert_allclose(losses, fixture["losses"][3:], rtol=1e-5)
        # beta_1, beta_2, decay were variables of the legacy optimizer; Keras 3 keeps floats,
        # restored from them (decay must be 0)
        status.assert_consumed()
        assert isinstance(opt.beta_1, float) and abs(opt.beta_1 - 0.9) < 1e-7
    else:
        # step 4 only reads the restored weights: bit for bit everywhere (CPU and, measured on
        # an H100, GPU). On CPU step 5 (the restored moments) is bit for bit too, and JAX stays
        # so at step 6 while torch's fused Adam rounds differently (~1e-7); on GPU steps 5-6
        # are ~1e-7 apart (TF32-class matmuls)
        assert losses[0] == fixture["losses"][3]
        if on_cpu(net.trainable_variables[0]):
            assert losses[:2] == fixture["losses"][3:5]
            if keras.backend.backend() == "jax":
                assert losses == fixture["losses"][3:]
        np.testing.assert_allclose(losses, fixture["losses"][3:], rtol=1e-6)
        status.assert_consumed()
    assert int(numpy(step)) == 3 and int(numpy(opt.iterations)) == 6
    # the restored values themselves: a fresh program restored, then built without training
    net2, opt2, _, ckpt2 = program(flavour)
    restore_from_tensorflow(ckpt2, os.path.join(FIXTURES, flavour)).expect_partial()
    net2(x[0])
    opt2.build(net2.trainable_variables)
    values = fixture["values"]
    suffix = "_kernel" if flavour == "keras3" else "kernel"
    if flavour == "tfkeras2_sequential":
        pairs = [("layer_with_weights-0", net2.layers[0]), ("layer_with_weights-1", net2.layers[2])]
    else:
        pairs = [("hidden", net2.hidden), ("out", net2.out)]
    for name, layer in pairs:
        np.testing.assert_array_equal(
            numpy(layer.kernel),
            np.array(values[f"model/{name}/{suffix}/.ATTRIBUTES/VARIABLE_VALUE"], np.float32),
        )
        np.testing.assert_array_equal(
            numpy(layer.bias),
            np.array(values[f"model/{name}/bias/.ATTRIBUTES/VARIABLE_VALUE"], np.float32),
        )
    moments = [numpy(m) for m in opt2._momentums]
    if flavour == "tfkeras2_legacy":
        key = "model/hidden/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"
    else:
        index = 2 if flavour == "keras3" else 1  # tf.keras 2 had no learning-rate entry
        key = f"optimizer/_variables/{index}/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(moments[0], np.array(values[key], np.float32))
    assert int(numpy(opt2.iterations)) == 3


def test_tf_checkpoint_into_a_built_model_and_saved_again_by_shardpoint(tmp_path):
    """Migration: TF checkpoint -> Keras 3 model (already built) -> shardpoint checkpoint with
    the same keys as TF + Keras 3 wrote."""
    net, opt, step, ckpt = program()
    x, y = batches()
    net(x[0])
    opt.build(net.trainable_variables)
    restore_from_tensorflow(ckpt, os.path.join(FIXTURES, "keras3", "ckpt-1")).assert_consumed()
    path = ckpt.write(tmp_path / "migrated")
    with open(os.path.join(FIXTURES, "keras3.json")) as f:
        tf_values = json.load(f)["values"]
    ours = dict(sp.list_variables(path))
    assert set(tf_values) <= set(ours)
    with sp.load_checkpoint(path) as reader:
        for key, value in tf_values.items():
            np.testing.assert_array_equal(
                reader.get_tensor(key), np.array(value).astype(reader.get_tensor(key).dtype)
            )


def test_damaged_tf_checkpoint_is_refused_before_any_assignment(tmp_path):
    """A flipped byte in the object graph: ChecksumMismatchError naming the file and key, and
    the model keeps its own values."""
    src = os.path.join(FIXTURES, "keras3")
    dst = tmp_path / "damaged"
    shutil.copytree(src, dst)
    data = dst / "ckpt-1.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    marker = raw.find(b"_CHECKPOINTABLE_OBJECT_GRAPH")
    position = marker if marker >= 0 else len(raw) - 20
    raw[position] ^= 0x40
    data.write_bytes(bytes(raw))
    net, opt, step, ckpt = program()
    x, _ = batches()
    net(x[0])
    before = numpy(net.hidden.kernel).copy()
    with pytest.raises(sp.CorruptCheckpointError, match=r"_CHECKPOINTABLE_OBJECT_GRAPH|checksum"):
        restore_from_tensorflow(ckpt, dst / "ckpt-1")
    np.testing.assert_array_equal(numpy(net.hidden.kernel), before)


class GuideNet(keras.Model):
    """The TF guide's Net: one Dense(5)."""

    def __init__(self):
        super().__init__()
        self.l1 = keras.layers.Dense(5)

    def call(self, x):
        return self.l1(x)


def guide_batches(start, n):
    """The guide's toy dataset, repeated in batches of 2, from batch number ``start`` on: the
    batches TF's restored iterator would hand out (the iterator itself is not restorable)."""
    inputs = np.arange(10, dtype=np.float32)[:, None]
    labels = inputs * 5 + np.arange(5, dtype=np.float32)[None, :]
    out = []
    for b in range(start, start + n):
        idx = [(2 * b) % 10, (2 * b + 1) % 10]
        out.append((inputs[idx], labels[idx]))
    return out


def test_tf_guide_checkpoint_with_iterator_restores_and_training_continues():
    """TF's guide flow (step, optimizer, net and a tf.data iterator in one tf.train.Checkpoint,
    saved by a CheckpointManager) restored into the same program in Keras 3 without the
    iterator: the rest restores, training goes on with TF's losses, and the iterator's state is
    reported as not restorable (never as corruption)."""
    with open(os.path.join(FIXTURES, "tf_guide_iterator.json")) as f:
        fixture = json.load(f)
    net, opt = GuideNet(), keras.optimizers.Adam(0.1)
    net.compile(optimizer=opt, loss="mae")  # the guide's loss: mean |net(x) - y|
    step = sp.Variable(1)
    ckpt = sp.Checkpoint(step=step, optimizer=opt, net=net)
    status = restore_from_tensorflow(ckpt, os.path.join(FIXTURES, "tf_guide_iterator"))
    assert int(step.numpy()) == 10
    done = fixture["saved_after_steps"]
    batches = guide_batches(done, len(fixture["losses"]) - done)
    assert batches[0][0].tolist() == fixture["next_batch_x"]  # where TF's iterator resumes
    losses = [float(net.train_on_batch(x, y)) for x, y in batches]
    np.testing.assert_allclose(losses, fixture["losses"][done:], rtol=1e-6)
    assert int(numpy(opt.iterations)) == len(fixture["losses"])
    status.assert_existing_objects_matched()
    with pytest.raises(sp.objgraph.LoadStatusError, match="tf.data iterator's state"):
        status.assert_consumed()
    status.expect_partial()
