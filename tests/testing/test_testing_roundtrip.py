"""shardpoint.testing.assert_roundtrip on each kind of state it takes, and the bugs of our own
code that the kit found, each held here by a test:

* a Python float NaN lost its payload and sign in ``sp.save_file`` and
  ``shardpoint.torch.save`` (0xfff8000000000001 came back as 0x7ff8000000000000);
* tuples of plain values came back as lists from ``sp.save_file`` (and nested in torch state
  dicts' values, optimizer ``betas`` for one);
* an ``sp.Variable`` holding packed float4 (``float4_e2m1fn_x2``) saved, but restoring it
  raised ``DTypeMismatchError`` (its spec said ``uint8``): found by CheckpointManagerMachine.
"""

from __future__ import annotations

import os
import struct

import ml_dtypes
import numpy as np
import pytest

import shardpoint as sp
from shardpoint.storage.dtypes import PACKED_FP4
from shardpoint.testing import assert_identical, assert_roundtrip

NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]
SNAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0]


def bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


def test_float_nan_payload_and_sign_survive_save_file(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"x": NEG_NAN, "s": SNAN, "l": [NEG_NAN, 1.0], "c": complex(NEG_NAN, -0.0)}, p)
    got = sp.load_file(p)
    assert bits(got["x"]) == 0xFFF8000000000001
    assert bits(got["s"]) == 0x7FF0000000000001
    assert bits(got["l"][0]) == 0xFFF8000000000001 and type(got["l"]) is list
    assert bits(got["c"].real) == 0xFFF8000000000001 and bits(got["c"].imag) == bits(-0.0)
    # the canonical NaN and other floats keep their plain entries (FORMAT.md §6)
    sp.save_file({"n": float("nan"), "z": -0.0}, p)
    with sp.open(p) as r:
        assert r.info("n").kind == "float" and r.info("z").kind == "float"
        assert bits(r["z"]) == bits(-0.0)


def test_float_nan_payload_survives_torch_save(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from shardpoint import torch as sptorch

    p = str(tmp_path / "ck")
    sptorch.save({"w": torch.ones(2), "x": NEG_NAN, "opt": {"betas": (0.9, NEG_NAN)}}, p)
    got = sptorch.load(p)
    assert bits(got["x"]) == 0xFFF8000000000001
    assert type(got["opt"]["betas"]) is tuple and bits(got["opt"]["betas"][1]) == 0xFFF8000000000001


def test_tuples_stay_tuples(tmp_path) -> None:
    p = str(tmp_path / "ck")
    value = {"t": (1, (2, "x")), "l": [(1.5,), [2]], "d": {"k": (None, True)}}
    sp.save_file(value, p)
    assert_identical(value, sp.load_file(p))


def test_packed_float4_variable_restores(tmp_path) -> None:
    codes = np.arange(256, dtype=np.uint8).view(PACKED_FP4)
    ck = sp.Checkpoint(v=sp.Variable(codes))
    fresh = assert_roundtrip(ck)
    assert_identical(codes, fresh.v.numpy())


def test_state_dicts_of_every_kind_of_value() -> None:
    value = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4).T,  # strided on the way in
        "bf": np.array([1, -0.0, np.nan], ml_dtypes.bfloat16),
        "empty": np.zeros((2, 0, 3), np.complex64),
        "scalar": np.float16(-0.0),
        "nested": {"a.b": [1, (2, 3)], "a/b": {5: "int key"}},
        "big": -(7**100),
        "set": {1, 2},
    }
    got = assert_roundtrip(value, compression="zstd", chunk_bytes=4096, shards=2)
    assert sorted(got) == sorted(value)


def test_non_mapping_values_are_wrapped() -> None:
    assert_identical((1, [2.0]), assert_roundtrip((1, [2.0])))


def test_detects_a_difference_at_a_given_path(tmp_path) -> None:
    """What it compares against is the value given: a file that differs is reported."""
    p = str(tmp_path / "ck")
    assert_roundtrip({"x": np.arange(3)}, path=p)
    assert sp.exists(p)  # a path given is kept
    with pytest.raises(AssertionError, match="unexpected"):
        # save_file keeps only what it is given; a reader sees exactly that mapping
        assert_identical({"x": np.arange(3)}, {**sp.load_file(p), "y": 1})


def test_torch_state_dicts_keep_sharing() -> None:
    torch = pytest.importorskip("torch")
    w = torch.arange(12.0).reshape(3, 4)
    state = {"enc": w, "dec": w, "dec_t": w.T, "lr": 0.1, "size": torch.Size([3, 4])}
    got = assert_roundtrip(state)
    assert got["enc"].untyped_storage().data_ptr() == got["dec_t"].untyped_storage().data_ptr()
    model = torch.nn.Linear(3, 2)
    assert_roundtrip(dict(model.state_dict()))


def test_jax_trees() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    tree = {
        "params": {"k": jnp.arange(6.0).reshape(2, 3)},
        "step": 3,
        "mask": (jnp.zeros(2, bool),),
    }
    got = assert_roundtrip(tree)
    assert isinstance(got["params"]["k"], jax.Array)


def test_checkpoint_objects_restore_into_a_fresh_copy(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    ck = sp.Checkpoint(model=model, opt=opt, step=sp.Variable(np.int64(7)))
    fresh = assert_roundtrip(ck, path=os.path.join(tmp_path, "ck"))
    assert fresh is not ck and fresh.model is not model
    assert_identical(model.state_dict(), fresh.model.state_dict())


def test_checkpoint_restore_that_does_nothing_is_caught(tmp_path) -> None:
    """The fresh copy's arrays are overwritten first: a restore that skipped them would show."""

    class Forgetful(sp.Module):
        def __init__(self) -> None:
            super().__init__()
            self.v = sp.Variable(np.arange(3.0))

    ck = sp.Checkpoint(m=Forgetful())
    ck.write(str(tmp_path / "ck"))
    from shardpoint.testing import roundtrip

    fresh = roundtrip._fresh_copy(ck)
    assert not np.array_equal(fresh.m.v.numpy(), ck.m.v.numpy())


def test_torch_expanded_tensor_tied_to_its_base(tmp_path) -> None:
    """An expanded tensor (stride 0) sharing storage with another: shardpoint.torch.load
    rebuilt the shared storage with copy_ into the expanded view, which torch refuses ("more
    than one element of the written-to tensor refers to a single memory location"; found by
    the nightly profile of test_torch_save_round_trips_state_dicts)."""
    torch = pytest.importorskip("torch")
    base = torch.tensor([True])
    state = {"a": {"a": base.expand(2)}, "a.b": base}
    got = assert_roundtrip(state, path=str(tmp_path / "t"))
    assert got["a"]["a"].stride() == (0,)
