"""``assert_roundtrip``: save with shardpoint, load through a fresh reader, ``assert_identical``.

Which save and load a value gets, by what it holds (the API a user of that kind of state
calls):

* an ``sp.Checkpoint`` (object graph): ``Checkpoint.write``, then ``read`` into a fresh copy of
  the object whose every array was overwritten first (a restore that did nothing fails); the
  saved values of both graphs are compared key by key;
* a tree holding torch tensors: ``shardpoint.torch.save`` / ``load``; storage shared between
  tensors must be shared again (``check_aliasing``), as ``shardpoint.torch`` promises;
* a tree holding jax arrays: ``shardpoint.jax.save``, then ``restore`` without a target (the
  stored structure, jax arrays as numpy arrays, NamedTuples and pytree nodes as dicts, as
  docs/JAX.md says) and with the value as its own target (jax arrays again);
* anything else, a state dict (``{str: value}``) for ``sp.save_file`` / ``sp.load_file``: its
  values are arrays or any Python value the format stores (FORMAT.md §6), nested or not. A
  value that is not a mapping with str keys is saved under the key ``"value"``.

Each load opens the checkpoint anew (no reader, handle or cache is shared with the save) and
every stored checksum is verified.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from .assertions import assert_identical, is_tensor

__all__ = ["assert_roundtrip"]


def _leaves(tree: Any, seen: set[int] | None = None) -> Iterator[Any]:
    """Every leaf of a tree of mappings, lists and tuples."""
    seen = set() if seen is None else seen
    if isinstance(tree, Mapping | list | tuple) and not is_tensor(tree):
        if id(tree) in seen:
            return
        seen.add(id(tree))
        for v in tree.values() if isinstance(tree, Mapping) else tree:
            yield from _leaves(v, seen)
    else:
        yield tree


def _holds(tree: Any, module: str, cls: str) -> bool:
    mod = sys.modules.get(module)
    kind = getattr(mod, cls, None) if mod is not None else None
    return kind is not None and any(isinstance(x, kind) for x in _leaves(tree))


def _is_checkpoint(value: Any) -> bool:
    objgraph = sys.modules.get("shardpoint.objgraph.checkpoint")
    return objgraph is not None and isinstance(value, objgraph.Checkpoint)


@contextmanager
def _where(path: str | os.PathLike[str] | None) -> Iterator[str]:
    if path is not None:
        yield os.fspath(path)
        return
    tmp = tempfile.mkdtemp(prefix="sp-roundtrip-")
    try:
        yield os.path.join(tmp, "ckpt")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def assert_roundtrip(
    value: Any, *, path: str | os.PathLike[str] | None = None, **save_kwargs: Any
) -> Any:
    """Save ``value``, load it through a fresh reader, assert it is identical; return it.

    ``path``: where to save (a prefix, a single-file name or an object-store URL); default a
    fresh temporary directory, removed afterwards (and saves there skip the fsyncs unless
    ``durable=True`` is passed). ``save_kwargs`` go to the save function (``compression=``,
    ``shards=``, ``chunk_bytes=``... as ``sp.save_file`` takes them; for an ``sp.Checkpoint``
    those of ``Checkpoint.write``). See the module docstring for which save and load each
    kind of value gets.
    """
    __tracebackhide__ = True
    if path is None and not _is_checkpoint(value):
        save_kwargs.setdefault("durable", False)  # a scratch directory: nothing to make durable
    with _where(path) as where:
        if _is_checkpoint(value):
            return _checkpoint(value, where, save_kwargs)
        if _holds(value, "torch", "Tensor"):
            return _torch(value, where, save_kwargs)
        if _holds(value, "jax", "Array"):
            return _jax(value, where, save_kwargs)
        return _files(value, where, save_kwargs)


def _verify(where: str, storage_options: Any) -> None:
    from ..storage import open as open_checkpoint

    with open_checkpoint(where, storage_options=storage_options) as r:
        r.verify()


def _files(value: Any, where: str, save_kwargs: dict[str, Any]) -> Any:
    from ..storage import load_file, save_file

    wrapped = not (isinstance(value, Mapping) and all(type(k) is str for k in value))
    state = {"value": value} if wrapped else value
    save_file(state, where, **save_kwargs)
    opts = save_kwargs.get("storage_options")
    _verify(where, opts)
    loaded = load_file(where, storage_options=opts)
    if wrapped:
        assert_identical({"value": value}, loaded)
        return loaded["value"]
    # the top level is the file itself: a mapping of any type comes back as a dict
    assert_identical(dict(state), loaded)
    return loaded


def _torch(value: Any, where: str, save_kwargs: dict[str, Any]) -> Any:
    from ..torch import load, save

    save(value, where, **save_kwargs)
    opts = save_kwargs.get("storage_options")
    _verify(where, opts)
    loaded = load(where, storage_options=opts)
    assert_identical(value, loaded, check_aliasing=True)
    return loaded


def _as_stored_by_jax(tree: Any) -> Any:
    """What ``shardpoint.jax.restore`` without a target gives back for ``tree``."""
    import jax

    if tree is None:
        return None
    if isinstance(tree, jax.Array | np.generic):
        return np.asarray(tree)
    if isinstance(tree, np.ndarray | bool | int | float | str | bytes):
        return tree
    if isinstance(tree, dict):
        return {k: _as_stored_by_jax(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):
        fields = type(tree)._fields  # type: ignore[attr-defined]  # a namedtuple
        return {f: _as_stored_by_jax(getattr(tree, f)) for f in fields}
    if type(tree) in (list, tuple):
        return type(tree)(_as_stored_by_jax(v) for v in tree)
    children, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda y: y is not tree)
    from ..jax.tree import _key_name

    return {_key_name(p[0]): _as_stored_by_jax(c) for p, c in children}


def _jax(value: Any, where: str, save_kwargs: dict[str, Any]) -> Any:
    from ..jax import restore, save

    save(value, where, **save_kwargs)
    _verify(where, None)
    assert_identical(_as_stored_by_jax(value), restore(where))
    loaded = restore(where, target=value)
    assert_identical(value, loaded)
    return loaded


# --------------------------------------------------------------------------------------------
# sp.Checkpoint
# --------------------------------------------------------------------------------------------


def _copied(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in values.items()
    }


def _scrambled(v: np.ndarray) -> np.ndarray:
    """Other bits in every element (bools negated: other bytes would not be bools)."""
    if v.dtype == np.bool_:
        return ~v
    out = np.array(v, copy=True)
    flat = out.reshape(-1).view(np.uint8)
    flat ^= 0xFF
    return out


def _retrack(obj: Any, seen: set[int]) -> None:
    """Give every ``Module`` reachable from ``obj`` fresh dependencies: a deep copy keeps the
    adapters of the original's foreign objects (they hold weak references, which copying
    shares), so each attribute is assigned again and gets the adapter of its own copy."""
    from ..objgraph.module import Module
    from ..objgraph.wrappers import DictWrapper, ListWrapper

    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, DictWrapper):
        for v in list(obj.values()):
            _retrack(v, seen)
        return
    if isinstance(obj, ListWrapper | tuple):
        for v in list(obj):
            _retrack(v, seen)
        return
    if not isinstance(obj, Module):
        return
    obj.__dict__.pop("_sp_st", None)
    for name, value in list(vars(obj).items()):
        if not name.startswith("_sp_"):
            _retrack(value, seen)
            setattr(obj, name, value)
    counter = obj.__dict__.get("_sp_save_counter")
    if counter is not None:
        obj._sp_track("save_counter", counter)
    root = obj.__dict__.get("_sp_root_strong")
    if root is not None:
        _retrack(root, seen)


def _independent(ck: Any, fresh: Any) -> None:
    """Refuse a copy that still shares memory with the original (restoring into it would
    write into the caller's objects)."""
    from ..objgraph.naming import serialize

    mine = [v for v in serialize(ck)[0].values() if isinstance(v, np.ndarray) and v.size]
    for key, v in serialize(fresh)[0].items():
        if isinstance(v, np.ndarray) and v.size and any(np.shares_memory(v, m) for m in mine):
            raise ValueError(
                f"assert_roundtrip: the copy of this sp.Checkpoint shares the memory of {key!r} "
                "with the original (an object that deep-copies by reference?); restore into "
                "a checkpoint of fresh objects yourself and compare with assert_identical"
            )


def _fresh_copy(ck: Any) -> Any:
    """A deep copy of ``ck`` whose arrays all hold other bits than ``ck``'s."""
    from ..objgraph.naming import walk

    memo: dict[int, Any] = {}
    saver = getattr(ck, "_sp_saver", None)
    if saver is not None:
        memo[id(saver)] = None  # threads and locks: the copy gets a saver of its own
    fresh = copy.deepcopy(ck, memo)
    _retrack(fresh, set())
    _independent(ck, fresh)
    for obj in walk(fresh, for_save=True).objects:
        values = obj._sp_values()
        other = {
            k: _scrambled(v) for k, v in values.items() if isinstance(v, np.ndarray) and v.size
        }
        if other:
            obj._sp_restore_values(other)
    return fresh


def _checkpoint(ck: Any, where: str, save_kwargs: dict[str, Any]) -> Any:
    from ..objgraph.naming import serialize

    expected = _copied(serialize(ck)[0])
    ck.write(where, **save_kwargs)
    _verify(where, None)
    fresh = _fresh_copy(ck)
    status = fresh.read(where)
    status.assert_existing_objects_matched()
    assert_identical(expected, _copied(serialize(fresh)[0]))
    return fresh
