"""``save`` / ``restore`` of JAX pytrees as shardpoint checkpoints.

Layout: every leaf is one entry under its key path (``params/dense/kernel``). A ``jax.Array``
that is not fully replicated is stored shard by shard: each distinct shard (replica 0 of it) is
an entry ``<key>@<box>`` where ``<box>`` is its ``start:stop`` range per axis
(``params/w@0:4,0:8``), written by the process that holds it. With several processes, each
writes its addressable shards through its own multi-rank :class:`shardpoint.Writer` and
process 0 merges the partial indexes once all have committed.

The tree structure and each array's global shape and dtype are kept in the checkpoint metadata
(``shardpoint.jax``), so restoring needs no target; with a target, the result takes the target's
structure, dtypes and shardings, and a sharded target reads, for each of its devices, only the
stored shards that overlap the device's box, and of those only the part it needs.
"""

from __future__ import annotations

import math
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import storage
from ..errors import CorruptCheckpointError, InvalidArgumentError, MissingKeyError
from ..storage.dtypes import format_name, numpy_dtype
from . import tree as tree_lib

__all__ = ["save", "restore", "META_KEY", "snapshot", "write_snapshot"]

META_KEY = "shardpoint.jax"
_FORMAT = 1


def _jax() -> Any:
    import jax

    return jax


def _is_jax_array(x: Any) -> bool:
    try:
        import jax
    except ImportError:
        return False
    return isinstance(x, jax.Array)


def _box_text(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    parts = []
    for sl, n in zip(index, shape, strict=True):
        start, stop, _ = sl.indices(n)
        parts.append(f"{start}:{stop}")
    return ",".join(parts)


def _parse_box(text: str, key: str) -> tuple[tuple[int, int], ...]:
    try:
        out = []
        for part in text.split(","):
            a, b = part.split(":")
            out.append((int(a), int(b)))
        return tuple(out)
    except ValueError:
        raise CorruptCheckpointError(f"key {key!r}: malformed shard box {text!r}") from None


def _process() -> tuple[int, int]:
    try:
        import jax
    except ImportError:
        return 0, 1
    return jax.process_index(), jax.process_count()


def snapshot(tree: Any) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The structure spec and the ``(key, host value)`` pairs this process must write.

    Device data is copied to host memory here, so the caller may change or donate its arrays
    as soon as this returns (what an asynchronous save needs)."""
    spec, leaves = tree_lib.walk(tree)
    me, _ = _process()
    records: dict[str, dict[str, Any]] = {}
    out: list[tuple[str, Any]] = []
    for key, leaf in leaves:
        if _is_jax_array(leaf):
            shape = tuple(int(d) for d in leaf.shape)
            rec: dict[str, Any] = {
                "kind": "array",
                "shape": list(shape),
                "dtype": format_name(np.dtype(leaf.dtype)),
            }
            if leaf.is_fully_replicated or len(leaf.sharding.device_set) == 1:
                if me == 0:
                    out.append((key, np.asarray(leaf.addressable_shards[0].data)))
            else:
                rec["sharded"] = True
                for sh in leaf.addressable_shards:
                    if sh.replica_id == 0:
                        box = _box_text(sh.index, shape)
                        out.append((f"{key}@{box}", np.asarray(sh.data)))
            records[key] = rec
        elif isinstance(leaf, (np.ndarray, np.generic)):
            a = np.asarray(leaf)
            records[key] = {"kind": "array", "shape": list(a.shape), "dtype": format_name(a.dtype)}
            if me == 0:
                out.append((key, np.array(a)))  # a copy: the caller may mutate its array
        elif isinstance(leaf, (bool, int, float, str, bytes)):
            records[key] = {"kind": "scalar", "type": type(leaf).__name__}
            if me == 0:
                out.append((key, leaf))
        else:
            raise InvalidArgumentError(
                f"leaf {key!r}: cannot save a {type(leaf).__name__} (use arrays or scalars)"
            )
    for leaf_spec in tree_lib.leaves_of(spec):
        leaf_spec.update(records[leaf_spec["key"]])
    return spec, out


def write_snapshot(
    prefix: str,
    spec: dict[str, Any],
    items: list[tuple[str, Any]],
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    durable: bool = True,
    metadata: dict[str, Any] | None = None,
    threads: int | None = None,
    merge: bool = True,
) -> None:
    """Write what :func:`snapshot` produced (this process's part) and commit. With several
    processes, ``merge`` waits for all of them and merges on process 0; without it the caller
    merges (Orbax's ``finalize``)."""
    me, world = _process()
    total = sum(v.nbytes for _, v in items if isinstance(v, np.ndarray))
    n = threads or max(1, min(os.cpu_count() or 1, math.ceil(total / (256 << 20))))
    meta = dict(metadata or {})
    meta[META_KEY] = {"format": _FORMAT, "tree": spec}
    token = os.environ.get("SHARDPOINT_JAX_MERGE_TOKEN") if world > 1 else None
    w = storage.Writer(
        prefix,
        compression=compression,
        level=level,
        shards=n,
        durable=durable,
        rank=me,
        world_size=world,
        metadata=meta,
        merge_token=token,
    )
    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="sp-jax-save") as pool:
            pending: deque[Future[None]] = deque()
            for key, value in items:
                pending.append(pool.submit(w.add, key, value))
                while len(pending) >= 2 * n:
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
        w.commit()
    except BaseException:
        w.abort()
        raise
    if world > 1 and merge:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"shardpoint.jax.save:{prefix}:written")
        if me == 0:
            storage.merge(prefix, world, durable=durable, token=token)
        multihost_utils.sync_global_devices(f"shardpoint.jax.save:{prefix}:merged")


def save(
    tree: Any,
    prefix: str | os.PathLike[str],
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    durable: bool = True,
    metadata: dict[str, Any] | None = None,
) -> None:
    """Save pytree ``tree`` as checkpoint ``prefix`` (atomically).

    Leaves may be ``jax.Array`` (sharded ones are written shard by shard, each process writing
    only its addressable shards), numpy arrays and scalars, and Python ``bool``/``int``/``float``/
    ``str``/``bytes``. Containers: dicts, lists, tuples, NamedTuples, ``None`` and registered
    pytree nodes (dataclasses, ``flax.struct``). Call it on every process of a multi-process run.
    """
    spec, items = snapshot(tree)
    write_snapshot(
        os.fspath(prefix),
        spec,
        items,
        compression=compression,
        level=level,
        durable=durable,
        metadata=metadata,
    )


# --- restore -----------------------------------------------------------------------------------
class _Source:
    """Reads leaves of one checkpoint: whole, or the box of one device."""

    def __init__(self, reader: storage.Reader, records: dict[str, dict[str, Any]]) -> None:
        self.r = reader
        self.records = records

    def record(self, key: str) -> dict[str, Any]:
        rec = self.records.get(key)
        if rec is not None:
            return rec
        if key in self.r:  # a plain shardpoint checkpoint: describe the entry from the index
            i = self.r.info(key)
            if i.kind == "tensor":
                return {"kind": "array", "shape": list(i.shape), "dtype": i.dtype}
            return {"kind": "scalar"}
        raise MissingKeyError(f"key {key!r} not found in checkpoint {self.r.path}")

    def pieces(self, key: str) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
        out = []
        for k in self.r.prefix(key + "@"):
            box = k[len(key) + 1 :]
            if "/" in box:
                continue
            out.append((k, _parse_box(box, k)))
        return out

    def read(self, key: str, index: tuple[slice, ...] | None = None) -> Any:
        """``key``'s value, or only the ``index`` box of it (a numpy array)."""
        rec = self.record(key)
        if rec["kind"] != "array":
            return self.r[key]
        shape = tuple(rec["shape"])
        dt = numpy_dtype(rec["dtype"])
        box = tuple(
            sl.indices(n)[:2]
            for sl, n in zip(index or tuple(slice(None) for _ in shape), shape, strict=True)
        )
        if not rec.get("sharded"):
            if index is None or not shape:
                return self.r.get(key, verify=True)
            return _read_box(self.r, key, box, (0,) * len(shape))
        out = np.empty(tuple(b - a for a, b in box), dtype=dt)
        covered = 0
        for pkey, pbox in self.pieces(key):
            inter = tuple(
                (max(a, pa), min(b, pb)) for (a, b), (pa, pb) in zip(box, pbox, strict=True)
            )
            if any(a >= b for a, b in inter):
                continue
            part = _read_box(self.r, pkey, inter, tuple(pa for pa, _ in pbox))
            dst = tuple(slice(a - ba, b - ba) for (a, b), (ba, _) in zip(inter, box, strict=True))
            out[dst] = part
            covered += part.size
        if covered != out.size:
            raise CorruptCheckpointError(
                f"key {key!r}: the stored shards cover {covered} of the {out.size} elements of "
                f"box {box} (a process's shards are missing?)"
            )
        return out


def _read_box(
    r: storage.Reader, key: str, box: tuple[tuple[int, int], ...], origin: tuple[int, ...]
) -> np.ndarray:
    """The ``box`` (global coordinates) of entry ``key`` whose first element is at ``origin``,
    read through ``Reader.get_slice``: only the pages (uncompressed) or chunks (compressed)
    holding the box are read."""
    local = tuple(slice(a - o, b - o) for (a, b), o in zip(box, origin, strict=True))
    if not local:
        return np.asarray(r[key])
    return np.asarray(r.get_slice(key)[local])


def _convert(src: _Source, key: str, target: Any) -> Any:
    """``key`` read as ``target`` describes it (dtype, shape, sharding, Python type)."""
    jax = None
    if _is_jax_array(target) or type(target).__name__ == "ShapeDtypeStruct":
        jax = _jax()
    if jax is not None and isinstance(target, (jax.Array, jax.ShapeDtypeStruct)):
        rec = src.record(key)
        shape = tuple(target.shape)
        if rec["kind"] != "array" or tuple(rec["shape"]) != shape:
            raise InvalidArgumentError(
                f"key {key!r}: checkpoint has {rec.get('dtype', rec['kind'])}{rec.get('shape', '')}, "
                f"target wants {target.dtype}{list(shape)}"
            )
        dtype = np.dtype(target.dtype)
        sharding = getattr(target, "sharding", None)
        if sharding is None:
            return jax.numpy.asarray(np.asarray(src.read(key)).astype(dtype, copy=False))
        return jax.make_array_from_callback(
            shape, sharding, lambda idx: src.read(key, idx).astype(dtype, copy=False)
        )
    value = src.read(key)
    if isinstance(target, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.shape != np.shape(target):
            raise InvalidArgumentError(
                f"key {key!r}: checkpoint has shape {list(a.shape)}, target wants {list(np.shape(target))}"
            )
        a = a.astype(target.dtype, copy=False)
        return a if isinstance(target, np.ndarray) else a[()]
    if isinstance(target, (bool, int, float, complex)) and not isinstance(value, (str, bytes)):
        return type(target)(np.asarray(value).item() if isinstance(value, np.ndarray) else value)
    return value


def restore(
    prefix: str | os.PathLike[str],
    target: Any = None,
    *,
    subtree: str | None = None,
) -> Any:
    """Restore a pytree saved by :func:`save`.

    Args:
        prefix: the checkpoint.
        target: optional tree giving the structure, dtypes and shardings of the result: its
            ``jax.Array``/``jax.ShapeDtypeStruct`` leaves are restored with their sharding
            (each device reads only the stored bytes of its own box, whatever mesh the checkpoint
            was written from), numpy leaves with their dtype, Python scalars with their type.
            Only the target's leaves are read (a partial restore). Without a target, the saved
            structure comes back with numpy arrays and Python scalars.
        subtree: restore only the subtree at this key path (``"params/dense"``); ``target``,
            when given, then describes that subtree.
    """
    with storage.open(os.fspath(prefix)) as r:
        stored = r.metadata.get(META_KEY)
        spec = stored.get("tree") if isinstance(stored, dict) else None
        records = {leaf["key"]: leaf for leaf in tree_lib.leaves_of(spec)} if spec else {}
        src = _Source(r, records)
        path: tuple[str, ...] = ()
        if subtree:
            path = tuple(tree_lib.unescape(p) for p in subtree.strip("/").split("/"))
        if target is None:
            if spec is None:
                raise InvalidArgumentError(
                    f"{r.path}: not written by shardpoint.jax.save (no tree in the metadata); "
                    "pass a target"
                )
            node = tree_lib.find(spec, path)
            if node is None:
                raise MissingKeyError(f"subtree {subtree!r} not found in checkpoint {r.path}")
            return tree_lib.rebuild(node, lambda key: src.read(key))
        return tree_lib.map_target(target, lambda key, t: _convert(src, key, t), path)
