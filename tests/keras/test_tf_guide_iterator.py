"""A checkpoint written by TensorFlow's guide flow, tf.data iterator included
(``tf.train.Checkpoint(step=..., optimizer=opt, net=net, iterator=iterator)``, TF 2.21 +
Keras 3; fixtures/gen_tf_guide_ckpt.py made it), restored without TensorFlow (issue 32).

The object graph names the iterator's value ``iterator/.ATTRIBUTES/ITERATOR`` while TensorFlow
stored it as ``iterator/.ATTRIBUTES/ITERATOR_STATE`` (a DT_VARIANT tensor: a saveable of
several tensors gets the attribute's key plus a suffix each). A target without an iterator
leaves it unmatched, as TensorFlow's ``expect_partial`` does; the state is reported as not
restorable, never as a damaged checkpoint. Needs neither TensorFlow nor Keras (the Keras 3
program of the guide runs in keras_tf_import_cases.py on each backend)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.convert import tf_checkpoint
from shardpoint.convert.tf_checkpoint import restore_from_tensorflow
from shardpoint.errors import CorruptCheckpointError
from shardpoint.objgraph.errors import DTypeMismatchError, LoadStatusError
from shardpoint.objgraph.trackable import Trackable, ValueSpec

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
GUIDE = os.path.join(FIXTURES, "tf_guide_iterator")


def fixture() -> dict:
    with open(os.path.join(FIXTURES, "tf_guide_iterator.json")) as f:
        return json.load(f)


def test_fixture_is_the_guide_flow_with_an_iterator():
    """What the tests below rely on, as TensorFlow wrote it (not rewritten by us)."""
    info = fixture()
    assert info["tf_version"].startswith("2.21")
    assert info["keys"]["iterator/.ATTRIBUTES/ITERATOR_STATE"] == "variant"
    assert "iterator/.ATTRIBUTES/ITERATOR" not in info["keys"]
    assert sorted(os.listdir(GUIDE)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]


def test_target_without_iterator_restores_the_rest_and_reports_the_iterator():
    """The guide's program minus the iterator (a shardpoint program has its own input
    pipeline): everything it has is restored, exactly; assert_consumed names the iterator's
    state as not restorable without TensorFlow; no corruption error anywhere."""
    values = fixture()["values"]
    step = sp.Variable(np.int32(0))
    kernel = sp.Variable(np.zeros((1, 5), np.float32))
    bias = sp.Variable(np.zeros(5, np.float32))
    l1 = sp.Checkpoint(bias=bias)
    l1._kernel = kernel
    root = sp.Checkpoint(step=step, net=sp.Checkpoint(l1=l1))
    status = restore_from_tensorflow(root, GUIDE)  # the CheckpointManager's directory
    assert int(step) == values["step/.ATTRIBUTES/VARIABLE_VALUE"] == 10
    np.testing.assert_array_equal(
        kernel.numpy(), np.array(values["net/l1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"], np.float32)
    )
    np.testing.assert_array_equal(
        bias.numpy(), np.array(values["net/l1/bias/.ATTRIBUTES/VARIABLE_VALUE"], np.float32)
    )
    status.assert_existing_objects_matched()
    with pytest.raises(LoadStatusError) as info:
        status.assert_consumed()
    text = str(info.value)
    assert "(root).iterator" in text and "not restorable without TensorFlow" in text
    assert "tf.data iterator's state" in text
    assert "'iterator/.ATTRIBUTES/ITERATOR_STATE' (DT_VARIANT)" in text
    status.expect_partial()


def test_unmatched_optimizer_and_iterator_stay_unmatched_on_every_later_access():
    """Values that wait for objects the target never creates: later attachments (a deferred
    restore reopens the files) still never take the iterator for a missing entry."""
    net = sp.Checkpoint()
    root = sp.Checkpoint(net=net)
    status = restore_from_tensorflow(root, os.path.join(GUIDE, "ckpt-1"))
    net.l1 = sp.Checkpoint(bias=sp.Variable(np.zeros(5, np.float32)))  # deferred: reopens
    assert net.l1.bias.numpy().any()
    with pytest.raises(LoadStatusError, match="not restorable without TensorFlow"):
        status.assert_consumed()
    status.expect_partial()


class _IteratorStandIn(Trackable):
    """An object that asks for the iterator's value (as a tf.data iterator would in TF)."""

    def _sp_value_specs(self):
        return {"ITERATOR": ValueSpec((), "int64")}

    def _sp_restore_values(self, values):  # pragma: no cover - must not be reached
        raise AssertionError("the iterator state must not be handed over")


def test_an_object_asking_for_the_iterator_state_is_refused_clearly():
    with pytest.raises(DTypeMismatchError) as info:
        restore_from_tensorflow(sp.Checkpoint(iterator=_IteratorStandIn()), GUIDE)
    text = str(info.value)
    assert "'iterator/.ATTRIBUTES/ITERATOR'" in text and "tf.data iterator's state" in text
    assert "(root).iterator" in text
    assert not isinstance(info.value, CorruptCheckpointError)


def test_a_graph_key_with_no_entry_at_all_is_still_corruption(tmp_path, monkeypatch):
    """The suffix rule only covers keys that prefix stored entries: a graph naming a key the
    index lacks entirely is still a damaged checkpoint."""
    shutil.copytree(GUIDE, tmp_path / "ck")
    real = tf_checkpoint.translate_keras2

    def rename_iterator_key(document):
        for node in real(document)["nodes"]:
            for attribute in node["attributes"]:
                if attribute["name"] == "ITERATOR":
                    attribute["key"] = "iterator/.ATTRIBUTES/GONE"
        return document

    monkeypatch.setattr(tf_checkpoint, "translate_keras2", rename_iterator_key)
    with pytest.raises(CorruptCheckpointError, match="names key 'iterator/.ATTRIBUTES/GONE'"):
        restore_from_tensorflow(sp.Checkpoint(step=sp.Variable(np.int32(0))), tmp_path / "ck")
