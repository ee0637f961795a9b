"""Pytrees as readable key paths, and back.

A tree is walked container by container: dicts (by key), lists and tuples (by index),
NamedTuples (by field name), ``None`` (an empty node), and any node registered with
``jax.tree_util`` (registered dataclasses, ``flax.struct`` classes...) by the key names jax gives
its children (attribute names, dict keys, indices). The path of a leaf is its names joined by
``/`` (``params/dense/kernel``); a ``/`` or ``~`` inside a name is escaped as ``~1`` / ``~0``
(JSON-pointer style), so every path is unambiguous and reversible.

The walk also yields a JSON description of the structure (``spec``), stored with the
checkpoint, so ``restore`` without a target can rebuild dicts, lists, tuples and ``None``;
NamedTuples and custom nodes come back as dicts of their fields, since their classes are not
imported from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["escape", "unescape", "join", "walk", "rebuild", "map_target", "is_leaf", "ROOT_KEY"]

#: The key of a tree that is a single leaf.
ROOT_KEY = "__root__"


def escape(name: str) -> str:
    """One path component, with ``~`` and ``/`` escaped."""
    return name.replace("~", "~0").replace("/", "~1")


def unescape(name: str) -> str:
    return name.replace("~1", "/").replace("~0", "~")


def join(path: tuple[str, ...]) -> str:
    """The storage key of a path of (unescaped) names."""
    return "/".join(escape(p) for p in path) if path else ROOT_KEY


def _jax() -> Any:
    try:
        import jax
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return jax


def is_leaf(x: Any) -> bool:
    """Arrays (numpy, jax, ShapeDtypeStruct) and Python/numpy scalars, strings and bytes."""
    if isinstance(x, (np.ndarray, np.generic, int, float, complex, str, bytes)):
        return True  # bool is an int
    jax = _jax()
    return jax is not None and isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _key_name(k: Any) -> str:
    """The name of one jax key-path entry."""
    for attr in ("name", "key", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _children(
    node: Any,
) -> tuple[dict[str, Any], list[tuple[str, Any]], Callable[[list[Any]], Any]]:
    """``(spec without children, [(name, child)], rebuild(children))`` of a container node."""
    if isinstance(node, dict):
        keys = list(node)
        for k in keys:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise InvalidArgumentError(f"dict keys must be str or int, got {k!r}")
        kinds = ["i" if isinstance(k, int) else "s" for k in keys]
        kind = type(node)
        return (
            {"t": "dict", "keys": [[t, k] for t, k in zip(kinds, keys, strict=True)]},
            [(str(k), node[k]) for k in keys],
            lambda cs: (
                kind(zip(keys, cs, strict=True))
                if kind is not dict
                else dict(zip(keys, cs, strict=True))
            ),
        )
    if _is_namedtuple(node):
        fields = list(type(node)._fields)
        cls = type(node)
        return (
            {"t": "namedtuple", "name": cls.__name__, "fields": fields},
            [(f, getattr(node, f)) for f in fields],
            lambda cs: cls(*cs),
        )
    if isinstance(node, (list, tuple)):
        seq = type(node)
        return (
            {"t": "list" if isinstance(node, list) else "tuple"},
            [(str(i), v) for i, v in enumerate(node)],
            lambda cs: seq(cs) if seq in (list, tuple) else seq(cs),
        )
    jax = _jax()
    if jax is None:
        raise InvalidArgumentError(
            f"cannot save a {type(node).__name__}: not a known container or leaf"
        )
    pairs, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda y: y is not node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        raise InvalidArgumentError(
            f"cannot save a {type(node).__name__}: not an array, scalar, or registered pytree node"
        )
    names = []
    for path, _ in pairs:
        if len(path) != 1:
            raise InvalidArgumentError(f"{type(node).__name__}: unexpected key path {path}")
        names.append(_key_name(path[0]))
    return (
        {"t": "node", "name": type(node).__qualname__, "fields": names},
        [(n, c) for n, (_, c) in zip(names, pairs, strict=True)],
        treedef.unflatten,
    )


def walk(tree: Any, path: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """``(spec, [(key, leaf)])`` of ``tree``, leaves in walk order."""
    leaves: list[tuple[str, Any]] = []

    def go(node: Any, p: tuple[str, ...]) -> dict[str, Any]:
        if node is None:
            return {"t": "none"}
        if is_leaf(node):
            key = join(p)
            leaves.append((key, node))
            return {"t": "leaf", "key": key}
        spec, kids, _ = _children(node)
        spec["c"] = [go(c, p + (n,)) for n, c in kids]
        return spec

    return go(tree, path), leaves


def map_target(target: Any, fn: Callable[[str, Any], Any], path: tuple[str, ...] = ()) -> Any:
    """A tree of ``target``'s structure whose leaves are ``fn(key, target_leaf)``."""
    if target is None:
        return None
    if is_leaf(target):
        return fn(join(path), target)
    _, kids, build = _children(target)
    return build([map_target(c, fn, path + (n,)) for n, c in kids])


def rebuild(spec: dict[str, Any], leaf: Callable[[str], Any]) -> Any:
    """A tree of plain containers from a stored ``spec``; leaves are ``leaf(key)``."""
    t = spec.get("t")
    if t == "none":
        return None
    if t == "leaf":
        return leaf(spec["key"])
    kids = [rebuild(c, leaf) for c in spec["c"]]
    if t == "dict":
        return {k: v for (_, k), v in zip(spec["keys"], kids, strict=True)}
    if t == "list":
        return kids
    if t == "tuple":
        return tuple(kids)
    if t in ("namedtuple", "node"):
        return dict(zip(spec["fields"], kids, strict=True))
    raise InvalidArgumentError(f"unknown node type {t!r} in the stored tree")


def find(spec: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    """The sub-spec at ``path`` (unescaped names), or ``None``."""
    node = spec
    for name in path:
        t = node.get("t")
        if t == "dict":
            names = [str(k) for _, k in node["keys"]]
        elif t in ("namedtuple", "node"):
            names = node["fields"]
        elif t in ("list", "tuple"):
            names = [str(i) for i in range(len(node["c"]))]
        else:
            return None
        if name not in names:
            return None
        node = node["c"][names.index(name)]
    return node


def leaves_of(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if spec.get("t") == "leaf":
        yield spec
    for c in spec.get("c", ()):
        yield from leaves_of(c)
