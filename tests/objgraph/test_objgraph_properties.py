"""Property tests: random object graphs (nesting, sharing, cycles, lists/dicts/tuples).

A *blueprint* describes modules, variables and the edges between them; building it twice gives
two structurally equal graphs. Saving one and restoring into the other must round-trip every
value bit for bit, both when the fresh graph is complete before restore() and when it is
attached piece by piece afterwards, in a random order (deferred restore). Variable values are
raw bit patterns of every dtype the format stores (shardpoint.testing.strategies), compared
with shardpoint.testing.assert_identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardpoint.objgraph.checkpoint import Checkpoint
from shardpoint.objgraph.module import Module
from shardpoint.objgraph.naming import walk
from shardpoint.objgraph.variables import Variable
from shardpoint.testing import assert_identical, assert_roundtrip
from shardpoint.testing.strategies import tensors

NAME_STEMS = ["a", "b", "x/y", "p.q", "..", "_z", ".ATTRIBUTES"]


@dataclass(frozen=True)
class Edge:
    src: int  # module index
    kind: str  # attr | list | dict | tuple
    name: str
    targets: tuple[tuple[str, int], ...]  # ("m", module) or ("v", variable)
    incremental: bool  # lists/dicts: create empty, then append/set one step at a time


@dataclass(frozen=True)
class Blueprint:
    n_modules: int
    variables: tuple[np.ndarray, ...]  # the saved values
    edges: tuple[Edge, ...]


@st.composite
def blueprints(draw):
    n_modules = draw(st.integers(1, 4))
    values = tensors(shape=st.sampled_from([(), (3,), (2, 2)]), layout="contiguous")
    variables = tuple(draw(values) for _ in range(draw(st.integers(1, 5))))
    target = st.one_of(
        st.tuples(st.just("m"), st.integers(0, n_modules - 1)),
        st.tuples(st.just("v"), st.integers(0, len(variables) - 1)),
    )
    edges = []
    for i, _ in enumerate(range(draw(st.integers(1, 8)))):
        kind = draw(st.sampled_from(["attr", "attr", "list", "dict", "tuple"]))
        count = 1 if kind == "attr" else draw(st.integers(1, 3))
        edges.append(
            Edge(
                src=draw(st.integers(0, n_modules - 1)),
                kind=kind,
                name=f"{draw(st.sampled_from(NAME_STEMS))}{i}",
                targets=tuple(draw(target) for _ in range(count)),
                incremental=draw(st.booleans()),
            )
        )
    return Blueprint(n_modules, variables, tuple(edges))


def build(bp: Blueprint, filled: bool):
    """Objects plus a list of attachment steps (closures) with their ordering groups."""
    mods = [Module() for _ in range(bp.n_modules)]
    variables = [Variable(v if filled else np.zeros(v.shape, v.dtype)) for v in bp.variables]

    def obj(t):
        return mods[t[1]] if t[0] == "m" else variables[t[1]]

    steps: list[tuple[int, object]] = []  # (group id, closure); a group's steps stay in order
    for gid, e in enumerate(bp.edges):
        src = mods[e.src]
        if e.kind == "attr":
            steps.append((gid, lambda s=src, e=e: setattr(s, e.name, obj(e.targets[0]))))
        elif e.kind == "tuple":
            steps.append(
                (gid, lambda s=src, e=e: setattr(s, e.name, tuple(obj(t) for t in e.targets)))
            )
        elif e.kind == "list" and e.incremental:
            steps.append((gid, lambda s=src, e=e: setattr(s, e.name, [])))
            for t in e.targets:
                steps.append((gid, lambda s=src, e=e, t=t: getattr(s, e.name).append(obj(t))))
        elif e.kind == "list":
            steps.append((gid, lambda s=src, e=e: setattr(s, e.name, [obj(t) for t in e.targets])))
        elif e.incremental:
            steps.append((gid, lambda s=src, e=e: setattr(s, e.name, {})))
            for i, t in enumerate(e.targets):
                steps.append(
                    (
                        gid,
                        lambda s=src, e=e, i=i, t=t: getattr(s, e.name).__setitem__(
                            f"k{i}", obj(t)
                        ),
                    )
                )
        else:
            steps.append(
                (
                    gid,
                    lambda s=src, e=e: setattr(
                        s, e.name, {f"k{i}": obj(t) for i, t in enumerate(e.targets)}
                    ),
                )
            )
    return mods, variables, steps


def ordered(steps, permutation):
    """Apply a permutation but keep each group's steps in their original relative order."""
    shuffled = [steps[i] for i in permutation]
    queues: dict[int, list] = {}
    for gid, fn in steps:
        queues.setdefault(gid, []).append(fn)
    return [queues[gid].pop(0) for gid, _ in shuffled]


def reachable_variable_indices(root, variables):
    ids = {id(o) for o in walk(root).objects}
    return [i for i, v in enumerate(variables) if id(v) in ids]


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(bp=blueprints())
def test_round_trip_into_equal_graph(tmp_path, bp):
    mods, variables, steps = build(bp, filled=True)
    for _, fn in steps:
        fn()
    root = Checkpoint(root=mods[0])
    path = root.write(tmp_path / "prop")
    fresh_mods, fresh_vars, fresh_steps = build(bp, filled=False)
    for _, fn in fresh_steps:
        fn()
    status = Checkpoint(root=fresh_mods[0]).read(path)
    status.assert_consumed()
    for i in reachable_variable_indices(root, variables):
        assert_identical(variables[i].numpy(), fresh_vars[i].numpy())


@SETTINGS
@given(bp=blueprints())
def test_round_trip_into_a_deep_copy(tmp_path, bp):
    """shardpoint.testing.assert_roundtrip: write, then read into a copy of the graph whose
    every array holds other bits; the saved values of both graphs must be identical."""
    mods, _, steps = build(bp, filled=True)
    for _, fn in steps:
        fn()
    assert_roundtrip(Checkpoint(root=mods[0]), path=tmp_path / "copy")


@SETTINGS
@given(bp=blueprints(), data=st.data())
def test_deferred_restore_any_attachment_order(tmp_path, bp, data):
    mods, variables, steps = build(bp, filled=True)
    for _, fn in steps:
        fn()
    root = Checkpoint(root=mods[0])
    path = root.write(tmp_path / "prop")
    fresh_mods, fresh_vars, fresh_steps = build(bp, filled=False)
    fresh_root = Checkpoint(root=fresh_mods[0])
    status = fresh_root.read(path)  # before anything is attached: everything is deferred
    permutation = data.draw(st.permutations(range(len(fresh_steps))))
    for fn in ordered(fresh_steps, permutation):
        fn()
    status.assert_consumed()
    for i in reachable_variable_indices(root, variables):
        assert_identical(variables[i].numpy(), fresh_vars[i].numpy())
