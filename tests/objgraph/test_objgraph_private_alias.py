"""The '_kernel' / 'kernel' alias of deferred restore (Keras 3 keeps a layer's weight in a
private attribute behind a public property; TF's guide attaches stand-ins by the public name)."""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.objgraph.trackable import private_alias


@pytest.mark.parametrize(
    ("name", "alias"),
    [
        ("kernel", "_kernel"),
        ("_kernel", "kernel"),
        ("0", None),
        ("_", None),
        ("__x", None),
        ("", None),
    ],
)
def test_private_alias(name, alias):
    assert private_alias(name) == alias


def saved(tmp_path):
    layer = sp.Checkpoint()
    layer._kernel = sp.Variable(np.arange(3, dtype=np.float32))
    layer.bias = sp.Variable(np.ones(2, np.float32))
    return sp.Checkpoint(l1=layer).write(tmp_path / "ck")


def test_waiting_private_name_is_satisfied_by_the_public_one(tmp_path):
    path = saved(tmp_path)
    stand_in = sp.Checkpoint()
    status = sp.Checkpoint(l1=stand_in).read(path)
    kernel = sp.Variable(np.zeros(3, np.float32))
    stand_in.kernel = kernel  # the checkpoint calls it _kernel
    assert kernel.numpy().tolist() == [0.0, 1.0, 2.0]
    bias = sp.Variable(np.zeros(2, np.float32))
    stand_in._bias = bias  # and the reverse direction
    assert bias.numpy().tolist() == [1.0, 1.0]
    status.assert_existing_objects_matched()


def test_exact_name_is_preferred_and_other_names_are_untouched(tmp_path):
    path = saved(tmp_path)
    stand_in = sp.Checkpoint()
    sp.Checkpoint(l1=stand_in).read(path).expect_partial()
    other = sp.Variable(np.zeros(3, np.float32))
    stand_in.kernel2 = other  # no alias relation
    assert not other.numpy().any()
    exact = sp.Variable(np.zeros(3, np.float32))
    stand_in._kernel = exact
    assert exact.numpy().tolist() == [0.0, 1.0, 2.0]
    late = sp.Variable(np.zeros(3, np.float32))
    stand_in.kernel = late  # the parked restore was consumed by the exact name
    assert not late.numpy().any()
