"""``shardpoint.jax.save`` / ``restore``: pytree structure, key paths, dtypes, targets, subtrees."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is an optional dependency (shardpoint[jax])")
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.jax as spj  # noqa: E402


class Adam(NamedTuple):
    mu: object
    nu: object
    count: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: dict
    opt: Adam
    step: jax.Array
    tag: str = dataclasses.field(default="run", metadata={"static": True})


def _state() -> TrainState:
    k = jax.random.PRNGKey(0)
    params = {
        "dense": {"kernel": jax.random.normal(k, (8, 4)), "bias": jnp.zeros(4, jnp.bfloat16)},
        "emb/x": jnp.arange(10, dtype=jnp.int32),  # a '/' inside a name
        "blocks": [{"w": jnp.ones((2, 2)) * i} for i in range(3)],
    }
    opt = Adam(
        mu=jax.tree_util.tree_map(jnp.zeros_like, params),
        nu=None,
        count=np.int64(5),
    )
    return TrainState(params=params, opt=opt, step=jnp.asarray(7))


def _leaves_equal(a, b) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def test_round_trip_into_target_structure(tmp_path) -> None:
    st = _state()
    spj.save(st, tmp_path / "ck")
    got = spj.restore(tmp_path / "ck", target=st)
    assert isinstance(got, TrainState) and isinstance(got.opt, Adam)
    assert got.opt.nu is None and got.tag == "run"
    assert isinstance(got.params["dense"]["kernel"], jax.Array)
    assert isinstance(got.opt.count, np.int64)  # numpy scalar targets stay numpy scalars
    _leaves_equal(got, st)


def test_keys_are_readable_paths(tmp_path) -> None:
    spj.save(_state(), tmp_path / "ck")
    with sp.open(tmp_path / "ck") as r:
        keys = r.keys()
    assert "params/dense/kernel" in keys
    assert "params/blocks/2/w" in keys
    assert "params/emb~1x" in keys  # '/' in a name is escaped
    assert "opt/mu/dense/bias" in keys and "opt/count" in keys and "step" in keys
    assert not any(k.startswith("opt/nu") for k in keys)


def test_restore_without_target_gives_plain_containers(tmp_path) -> None:
    tree = {"a": [1, 2.5, True, "s", b"\x00b"], "t": (np.arange(3), None), "n": None}
    spj.save(tree, tmp_path / "ck")
    got = spj.restore(tmp_path / "ck")
    assert got["a"] == [1, 2.5, True, "s", b"\x00b"]
    assert isinstance(got["t"], tuple) and got["t"][1] is None and got["n"] is None
    assert np.array_equal(got["t"][0], np.arange(3))
    st = _state()
    spj.save(st, tmp_path / "st")
    plain = spj.restore(tmp_path / "st")
    assert set(plain) == {"params", "opt", "step"}  # a dataclass comes back as a dict
    assert set(plain["opt"]) == {"mu", "nu", "count"} and plain["opt"]["nu"] is None
    assert plain["params"]["dense"]["bias"].dtype == ml_dtypes.bfloat16


def test_target_dtypes_and_types_are_applied(tmp_path) -> None:
    spj.save({"w": jnp.arange(6.0).reshape(2, 3), "n": 3, "x": np.ones(2)}, tmp_path / "ck")
    target = {
        "w": jax.ShapeDtypeStruct((2, 3), jnp.bfloat16),
        "n": 0.0,
        "x": np.zeros(2, np.float32),
    }
    got = spj.restore(tmp_path / "ck", target=target)
    assert got["w"].dtype == jnp.bfloat16 and isinstance(got["w"], jax.Array)
    assert np.array_equal(np.asarray(got["w"], np.float32), np.arange(6.0).reshape(2, 3))
    assert got["n"] == 3.0 and isinstance(got["n"], float)
    assert got["x"].dtype == np.float32


def test_partial_restore_of_a_subtree(tmp_path) -> None:
    st = _state()
    spj.save(st, tmp_path / "ck")
    dense = spj.restore(tmp_path / "ck", subtree="params/dense")
    assert set(dense) == {"kernel", "bias"}
    assert np.array_equal(dense["kernel"], np.asarray(st.params["dense"]["kernel"]))
    blk = spj.restore(tmp_path / "ck", target={"w": jnp.zeros((2, 2))}, subtree="params/blocks/1")
    assert np.array_equal(np.asarray(blk["w"]), np.ones((2, 2)))
    # A target with fewer leaves than the checkpoint reads only those leaves.
    only = spj.restore(tmp_path / "ck", target={"step": jnp.asarray(0)})
    assert int(only["step"]) == 7
    with pytest.raises(sp.MissingKeyError, match="params/nope"):
        spj.restore(tmp_path / "ck", subtree="params/nope")


def test_mismatches_are_clear_errors(tmp_path) -> None:
    spj.save({"w": jnp.zeros((2, 3))}, tmp_path / "ck")
    with pytest.raises(sp.InvalidArgumentError, match=r"'w'.*target wants"):
        spj.restore(tmp_path / "ck", target={"w": jnp.zeros((3, 3))})
    with pytest.raises(sp.MissingKeyError, match="'v'"):
        spj.restore(tmp_path / "ck", target={"v": jnp.zeros(2)})
    with pytest.raises(sp.InvalidArgumentError, match="cannot save"):
        spj.save({"f": object()}, tmp_path / "bad")
    assert not os.path.exists(tmp_path / "bad.index")


def test_single_leaf_tree(tmp_path) -> None:
    spj.save(jnp.arange(4), tmp_path / "ck")
    assert np.array_equal(spj.restore(tmp_path / "ck"), np.arange(4))
    assert np.array_equal(
        np.asarray(spj.restore(tmp_path / "ck", target=jnp.zeros(4, jnp.int32))), np.arange(4)
    )


def test_plain_checkpoint_restores_with_a_target(tmp_path) -> None:
    sp.save_file({"a/b": np.arange(3.0)}, str(tmp_path / "ck"))
    got = spj.restore(tmp_path / "ck", target={"a": {"b": jnp.zeros(3)}})
    assert np.array_equal(np.asarray(got["a"]["b"]), np.arange(3.0))
    with pytest.raises(sp.InvalidArgumentError, match="pass a target"):
        spj.restore(tmp_path / "ck")


def test_package_imports_and_saves_numpy_without_jax(tmp_path) -> None:
    code = (
        "import sys; sys.modules['jax'] = None\n"
        "import numpy as np, shardpoint.jax as spj\n"
        f"spj.save({{'a': np.arange(3), 'b': [1, None]}}, {str(tmp_path / 'ck')!r})\n"
        f"t = spj.restore({str(tmp_path / 'ck')!r})\n"
        "assert t['b'] == [1, None] and t['a'].tolist() == [0, 1, 2]\n"
        "import shardpoint.objgraph, shardpoint.storage\n"
        "print('ok')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
