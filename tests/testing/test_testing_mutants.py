"""The kit catches planted bugs: each mutant below is a user's round-trip function with one
classic checkpointing bug, and ``@given(state_dicts())`` + ``assert_identical`` under the
active profile's settings (ci: Hypothesis' default of 100 examples, derandomized) must find
it. No false alarms: a correct round trip (an in-memory copy, and shardpoint's own save and
load for numpy, torch and jax state dicts) passes every example, thousands in the nightly
profile."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from kit_budget import scaled
from shardpoint.errors import DuplicateKeyError
from shardpoint.testing import assert_identical, assert_roundtrip
from shardpoint.testing.strategies import keys, shapes, state_dicts, tensors


def _map(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """A copy of ``tree`` with ``leaf`` applied to every leaf (tensors fresh copies)."""
    if isinstance(tree, dict):
        return {k: _map(v, leaf) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_map(v, leaf) for v in tree)
    return leaf(np.array(tree, copy=True) if isinstance(tree, np.ndarray) else tree)


def canonical_nans(tree: Any) -> Any:
    def leaf(x: Any) -> Any:
        if isinstance(x, float) and math.isnan(x):
            return float("nan")
        if isinstance(x, np.ndarray) and x.dtype.kind in "fcV" and x.dtype.names is None:
            try:
                mask = np.isnan(x)
            except TypeError:  # packed float4 and other dtypes without isnan
                return x
            x[mask] = np.nan
        return x

    return _map(tree, leaf)


def canonical_nans_16_32(tree: Any) -> Any:
    """A user's save/load canonicalising NaNs of float16/float32 arrays only (a NaN-cleaning
    pass keyed on the dtypes a model trains in): found in 1 run of 100 examples out of 5 by
    the kit as it was."""

    def leaf(x: Any) -> Any:
        if isinstance(x, np.ndarray) and x.dtype in (np.float16, np.float32):
            x[np.isnan(x)] = np.nan
        return x

    return _map(tree, leaf)


def bfloat16_through_float16(tree: Any) -> Any:
    """bfloat16 stored through float16: exact for the values a model mostly holds, wrong for
    the extreme exponents (and NaN payloads) that float16 cannot hold."""

    def leaf(x: Any) -> Any:
        if getattr(x, "dtype", None) == ml_dtypes.bfloat16:
            with np.errstate(all="ignore"):
                return x.astype(np.float16).astype(ml_dtypes.bfloat16)
        return x

    return _map(tree, leaf)


def flip_negative_zero(tree: Any) -> Any:
    def leaf(x: Any) -> Any:
        if isinstance(x, float):
            return 0.0 if x == 0 else x
        if isinstance(x, np.ndarray) and (x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16):
            x[x == 0] = 0  # -0.0 == 0.0: every zero written back as +0.0
        return x

    return _map(tree, leaf)


def widen_bfloat16(tree: Any) -> Any:
    return _map(
        tree,
        lambda x: x.astype(np.float32) if getattr(x, "dtype", None) == ml_dtypes.bfloat16 else x,
    )


def lose_zero_size_shape(tree: Any) -> Any:
    return _map(tree, lambda x: x.reshape(0) if isinstance(x, np.ndarray) and x.size == 0 else x)


def tuples_to_lists(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: tuples_to_lists(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [tuples_to_lists(v) for v in tree]
    return tree


def split_keys(tree: dict[str, Any]) -> dict[str, Any]:
    """Stores ``a.b`` / ``a/b`` as nested ``{"a": {"b": ...}}`` (a flat-key codec's bug)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        parts = [p for p in k.replace("/", ".").split(".") if p] or [k]
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            node[p] = nxt if isinstance(nxt, dict) else {}
            node = node[p]
        node[parts[-1]] = v
    return out


def drop_aliases(tree: Any) -> Any:
    return _map(tree, lambda x: x)  # every tensor its own copy


def round_big_ints(tree: Any) -> Any:
    return _map(tree, lambda x: int(float(x)) if type(x) is int else x)  # JSON-number habits


MUTANTS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "canonicalises NaNs": (canonical_nans, "bits|float differs"),
    "canonicalises float16/float32 NaNs": (canonical_nans_16_32, "bits"),
    "rounds bfloat16 through float16": (bfloat16_through_float16, "bits"),
    "flips -0.0": (flip_negative_zero, "0x8|float differs"),
    "widens bfloat16 to float32": (widen_bfloat16, "dtype differs: expected bfloat16"),
    "loses a zero-size shape": (lose_zero_size_shape, "shape differs"),
    "turns tuples into lists": (tuples_to_lists, "expected tuple"),
    "splits keys holding . or /": (split_keys, "keys differ"),
    "drops an alias": (drop_aliases, "aliasing lost"),
    "rounds a big int": (round_big_ints, "int differs"),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_kit_finds_the_mutant(name: str) -> None:
    mutant, message = MUTANTS[name]
    aliasing = mutant is drop_aliases

    # the ci profile's draw (100 examples, derandomized) whatever profile runs the suite: the
    # dev profile's 20 random examples find some mutants only most of the time (a flaky test);
    # generate only, nothing replayed or shrunk
    @settings(database=None, max_examples=100, derandomize=True, phases=tuple(Phase)[:3])
    @given(state_dicts())
    def round_trip_is_exact(state: dict[str, Any]) -> None:
        assert_identical(state, mutant(state), check_aliasing=aliasing)

    with pytest.raises(AssertionError, match=message):
        round_trip_is_exact()


#: Seeds of the detection sweep and the share of them that must find each mutant.
_SEEDS, _FOUND = 40, 0.95


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_kit_finds_each_mutant_under_most_seeds(name: str) -> None:
    """The ci profile's settings (100 examples) with random generation, as a user's run with
    another seed: each mutant is found in >= 95% of 40 seeds (docs/TESTING.md records the
    rates). Generation only: finding is what is measured, not shrinking."""
    mutant, _ = MUTANTS[name]
    aliasing = mutant is drop_aliases
    found = 0
    for s in range(_SEEDS):

        @seed(s)
        @settings(
            max_examples=100,
            derandomize=False,
            database=None,
            deadline=None,
            phases=(Phase.explicit, Phase.generate),
            suppress_health_check=list(HealthCheck),
        )
        @given(state_dicts())
        def round_trip_is_exact(state: dict[str, Any]) -> None:
            assert_identical(state, mutant(state), check_aliasing=aliasing)

        try:
            round_trip_is_exact()
        except AssertionError:
            found += 1
    assert found >= _FOUND * _SEEDS, f"{name}: found under {found} of {_SEEDS} seeds"


@given(state_dicts())
def test_a_correct_copy_passes(state: dict[str, Any]) -> None:
    assert_identical(state, copy.deepcopy(state))  # (a deep copy keeps no views: no aliasing)


@settings(deadline=None)  # writes and reads files: no per-example deadline, in any profile
@given(state_dicts())
def test_save_file_round_trips_state_dicts(state: dict[str, Any]) -> None:
    assert_roundtrip(state)


_SMALL = shapes(max_dims=3, max_side=4)


@settings(max_examples=scaled(0.3, at_least=20), suppress_health_check=[HealthCheck.too_slow])
@given(state_dicts(values=tensors(framework="torch", shape=_SMALL), keys=keys(), max_leaves=10))
def test_torch_save_round_trips_state_dicts(state: dict[str, Any]) -> None:
    try:
        assert_roundtrip(state)
    except DuplicateKeyError:
        pass  # "a/b" beside {"a": {"b"}}: torch keys are joined with "/", refused by design


@settings(max_examples=scaled(0.2, at_least=15), suppress_health_check=[HealthCheck.too_slow])
@given(state_dicts(values=tensors(framework="jax", shape=_SMALL), max_leaves=8, aliasing=False))
def test_jax_save_round_trips_trees(state: dict[str, Any]) -> None:
    assert_roundtrip(state)
