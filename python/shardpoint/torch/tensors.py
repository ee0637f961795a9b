"""Torch tensors to and from the storage layer, zero-copy where the bytes allow it.

The tensor codec (numpy bridging, dtypes, structure, sharing) is :mod:`shardpoint.torch.codec`;
its names are re-exported here.

:func:`save` / :func:`load` store (nested) state dicts. What they guarantee is in docs/TORCH.md:

* every value is bitwise identical after a round trip; uncompressed tensors come back as
  copy-on-write views of the mmapped shard (writes never reach the file);
* tensors that shared storage when saved share it again after loading (exact aliases such as
  tied weights are stored once; other overlapping views are rebuilt inside one fresh storage);
* other non-contiguous tensors are stored by value and come back contiguous;
* nesting (dicts with str/int/bool keys, lists, tuples, ``torch.Size``) and non-tensor leaves
  (int, float, str, bytes, bool, None, numpy arrays and scalars, ``torch.dtype``, and the
  Python objects of FORMAT.md §6.1: dataclasses, Namespace, sets, enums, datetimes, paths,
  OmegaConf configs...) are restored exactly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, cast

import torch

from .. import storage
from ..errors import InvalidArgumentError
from ..storage.async_save import AsyncSaver
from ..storage.dtypes import typed
from .codec import (
    _META_VERSION,
    METADATA_KEY,
    _rebuild_group,
    _sharing,
    _to_torch,
    flatten,
    format_dtype,
    numpy_to_tensor,
    tensor_to_numpy,
    torch_dtype,
    torch_section,
    unflatten,
)
from .file_objects import is_file_object, save_to_stream, stream_path
from .locations import MapLocation, is_plain_device, place, saved_locations

if TYPE_CHECKING:
    from ..storage.async_save import SaveFuture
    from .staging import TorchStagingBuffers

__all__ = [
    "save",
    "load",
    "tensor_to_numpy",
    "numpy_to_tensor",
    "format_dtype",
    "torch_dtype",
    "flatten",
    "unflatten",
    "METADATA_KEY",
]


def _prepare(
    obj: Any,
    keep_device: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Flat ``key -> storable value`` and our metadata section for a (nested) state dict.
    With ``keep_device``, tensors on an accelerator stay tensors (staged asynchronously)."""
    from .staging import is_device_tensor

    if not isinstance(obj, Mapping) and callable(getattr(obj, "state_dict", None)):
        obj = obj.state_dict()  # a module/optimizer: save its state dict
    flat, structure = flatten(obj)
    aliases, sharing = _sharing(flat)
    devices = saved_locations(flat)
    payload: dict[str, Any] = {}
    for key, leaf in flat.items():
        if key in aliases:
            continue
        if keep_device and is_device_tensor(leaf) and type(leaf.detach()) is torch.Tensor:
            payload[key] = leaf
        else:
            if isinstance(leaf, torch.Tensor):
                leaf = tensor_to_numpy(leaf, carrier=True)  # no ml_dtypes import
            payload[key] = leaf
    meta = {
        "version": _META_VERSION,
        "structure": structure,
        "aliases": aliases,
        "groups": sharing["groups"],
    }
    if devices:
        meta["devices"] = devices  # location tags for load(map_location=...)
    return payload, meta


def save(
    tensors: Any,
    prefix: str | os.PathLike[str] | IO[bytes],
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    shards: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    durable: bool = True,
    chunk_bytes: int | None = None,
    blocking: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    single_file: bool | None = None,
    base: str | os.PathLike[str] | None = None,
    delta: bool = False,
) -> SaveFuture | None:
    """Save a (nested) state dict of tensors and plain values as checkpoint ``prefix``.

    Args:
        tensors: a mapping (state dict, possibly nested), or an object with ``state_dict()``.
        prefix: path prefix (``prefix.index`` + ``prefix.data-*``), committed atomically; a
            path ending with ``.pt``, ``.pth``, ``.bin`` or ``.sp`` (or any path with
            ``single_file=True``) gets one file at that path instead, as ``torch.save``
            leaves (FORMAT.md §10); a writable binary file object (``io.BytesIO``, a file
            opened ``"wb"``) receives that single file's bytes.
        compression, level, shards, durable, chunk_bytes: as :func:`shardpoint.save_file`.
        metadata: JSON-able mapping stored in the index; ``sp.open(prefix).metadata`` returns
            exactly it (our own nesting information lives in a separate section).

        blocking: ``False`` returns a :class:`~shardpoint.storage.async_save.SaveFuture` (result
            ``None``) once the state is snapshotted: CPU tensors are copied into reusable host
            buffers (parallel, GIL released), CUDA tensors into pinned buffers by non-blocking
            copies ordered with the current stream (``shardpoint.torch.staging``); the write
            runs in the background, saves committing in call order. Tensors may be modified in
            place as soon as the call returns.
        storage_options: credentials/endpoint/knobs when ``prefix`` is an object-store URL
            (``s3://bucket/run/model``; docs/OBJECT_STORE.md).
        single_file: force (``True``) or refuse (``False``) the single-file form; ``None``
            decides by the name's suffix.
        base, delta: as :func:`shardpoint.save_file`: ``base=`` alone re-uses unchanged shard
            files of ``base`` by hard link (the checkpoint never depends on it); with
            ``delta=True`` tensors may be stored as the same bytes as, or the XOR against,
            ``base``'s (docs/DELTA.md; blocking saves to a path).

    Ctrl-C during the write stops it within a fraction of a second: nothing is committed,
    no temp file stays, the previous checkpoint at ``prefix`` is intact.

    Blocking saves write CPU tensors straight from their memory (no staging copy); non-CPU
    tensors are copied to the host first. Nested keys are joined with ``/``.
    """
    if is_file_object(prefix):
        if not blocking:
            raise InvalidArgumentError("blocking=False saves to a path, not to a file object")

        def write(path: str) -> None:
            save(
                tensors,
                path,
                compression=compression,
                level=level,
                metadata=metadata,
                durable=False,  # a private temp file, copied into the stream
                chunk_bytes=chunk_bytes,
                single_file=True,
            )

        save_to_stream(write, prefix)
        return None
    path = cast("str | os.PathLike[str]", prefix)
    if base is not None:
        payload, meta = _prepare(tensors)
        storage.save_file(
            payload, path, compression=compression, level=level, metadata=metadata,
            durable=durable, chunk_bytes=chunk_bytes, blocking=blocking, base=base,
            delta=delta, _sections={METADATA_KEY: meta},
        )  # fmt: skip
        return None
    payload, meta = _prepare(tensors, keep_device=not blocking)
    from .staging import TorchStagingBuffers, is_device_tensor

    device = {k: v for k, v in payload.items() if is_device_tensor(v)}
    host = {k: v for k, v in payload.items() if k not in device}
    plan, items = storage.plan_save(
        host,
        path,
        compression=compression,
        level=level,
        shards=shards,
        metadata=metadata,
        durable=durable,
        chunk_bytes=chunk_bytes,
        _sections={METADATA_KEY: meta},
        storage_options=storage_options,
        single_file=single_file,
    )
    if blocking:
        plan.write(items, None)
        return None

    def stage(bufs: TorchStagingBuffers) -> Callable[[], None]:
        copy, _ = bufs.stage(items, with_crc=False)
        dev_items, ready = bufs.stage_devices(device)

        def write() -> None:
            ready()
            plan.write(copy + dev_items, None)

        return write

    return _saver().submit(stage, new_buffers=TorchStagingBuffers)


_SAVER: AsyncSaver | None = None


def _saver() -> AsyncSaver:
    """The saver of ``shardpoint.torch.save(..., blocking=False)`` (its buffers take CUDA
    tensors, so it is not the storage face's default saver)."""
    global _SAVER
    if _SAVER is None:
        _SAVER = AsyncSaver(name="shardpoint-torch-save")
    return _SAVER


def load(
    f: str | os.PathLike[str] | IO[bytes],
    map_location: MapLocation = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    device: str | torch.device | None = None,
    keys: list[str] | None = None,
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    io: str = "auto",
    **pickle_load_args: Any,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save` (or any shardpoint checkpoint) as tensors.
    Takes ``torch.load``'s arguments with their meaning (docs/TORCH.md); nothing is ever
    unpickled.

    Args:
        f: the checkpoint: a prefix, a single file (``model.pt``), ``P.index`` (meaning ``P``),
            or a readable binary file object holding a single file (``io.BytesIO``, a file
            opened ``"rb"``).
        map_location: where tensors go, as ``torch.load`` takes it: ``None`` (the device each
            tensor was saved from; CPU for tensors saved from the CPU), a device string or
            ``torch.device``, a dict of location tags (``{"cuda:1": "cuda:0"}``), or a
            callable ``fn(storage, location)`` returning a storage or ``None``
            (``shardpoint.torch.locations``). On the CPU, uncompressed tensors are zero-copy,
            copy-on-write views of the file and compressed ones are decoded into fresh memory;
            other devices get one host-to-device copy per storage.
        pickle_module: accepted for torch's signature; must be ``None`` or ``pickle`` (nothing
            is unpickled, so no module is used).
        weights_only: accepted with any value: the result is the same, because nothing is ever
            unpickled (only tensors, plain values and their nesting are stored).
        mmap: ``True`` or ``None`` (default): uncompressed CPU tensors are zero-copy views of
            the mapped file (copy-on-write: writes never reach it). ``False``: read into
            private memory, nothing stays mapped.
        device: the older name of ``map_location`` for a single device (kept working).
        keys: load only these flat (``/``-joined) keys and return a flat dict of them.
        verify: check every value's crc32c (compressed values are always checked).
        storage_options: credentials/endpoint/knobs when ``f`` is an object-store URL.
        pickle_load_args: accepted for torch's signature and ignored (no unpickler runs).
        io: ``"mmap"`` (zero-copy views on the CPU), ``"pread"`` (private memory, large
            parallel reads) or ``"auto"`` (``pread`` on network/FUSE file systems); see
            :mod:`shardpoint.storage.io_mode`.

    Returns the nested state dict as saved (flat ``key -> value`` for ``keys=`` or for
    checkpoints not written by :func:`save`). Arrays saved as numpy stay numpy. Ctrl-C stops
    a long load within a fraction of a second.
    """
    del weights_only, pickle_load_args  # same result either way: nothing is unpickled
    if pickle_module is not None and getattr(pickle_module, "__name__", "") != "pickle":
        raise InvalidArgumentError(
            "pickle_module: shardpoint never unpickles, so no pickle module can be used"
        )
    if device is not None:
        if map_location is not None:
            raise InvalidArgumentError("pass map_location or device, not both")
        map_location = device
    copy = mmap is False
    if mmap is True and io == "auto":
        io = "mmap"  # asked for views of the file: never the pread fallback
    if is_file_object(f):
        with stream_path(f) as path:
            return _load(path, map_location, keys, verify, copy, storage_options, io)
    return _load(
        cast("str | os.PathLike[str]", f), map_location, keys, verify, copy, storage_options, io
    )


#: ``into`` of :func:`_load`: existing tensors nested as the checkpoint's state (or a function
#: of the checkpoint's skeleton, its nesting with ``None`` leaves, returning them)
Into = Mapping[str, Any] | Callable[[Any], Mapping[str, Any] | None]


def _load(
    prefix: str | os.PathLike[str],
    map_location: MapLocation,
    keys: list[str] | None,
    verify: bool,
    copy: bool,
    storage_options: Mapping[str, Any] | None,
    io: str = "auto",
    into: Into | None = None,
) -> dict[str, Any]:
    with storage.open(prefix, storage_options=storage_options, copy=copy, io=io) as reader:
        reader._carry = True  # bfloat16/float8 as torch views them: no ml_dtypes import
        meta = torch_section(reader)
        aliases: Mapping[str, Any] = meta.get("aliases", {}) if meta else {}
        locations: Mapping[str, str] = meta.get("devices", {}) if meta else {}
        numpy_keys = _numpy_leaves(meta["structure"]) if meta else set()
        wanted = reader.keys() if keys is None else list(keys)
        stored = [k for k in wanted if k not in aliases]
        stored += [
            aliases[k]["of"] for k in wanted if k in aliases and aliases[k]["of"] not in stored
        ]
        existing: dict[str, torch.Tensor] = {}
        if into is not None:
            existing = _into_existing(
                reader, meta, stored, numpy_keys, locations, into, map_location, verify
            )
        raw = reader.load([k for k in stored if k not in existing], verify=verify)
    out: dict[str, Any] = {
        k: (typed(v) if k in numpy_keys else _to_torch(v)) for k, v in raw.items()
    }
    out.update(existing)
    # One device for all: build shared-storage groups there directly (no CPU detour).
    dev = torch.device(map_location) if is_plain_device(map_location) else torch.device("cpu")
    for group in meta.get("groups", []) if meta else []:
        # members decoded into existing tensors stay those tensors (they share memory as the
        # live state does); the others share one fresh storage as saved
        members = {k: r for k, r in group["members"].items() if k not in existing}
        if members:
            _rebuild_group({**group, "members": members}, out, dev)
    if map_location is not None and is_plain_device(map_location):
        if dev.type != "cpu":
            place(out, {}, dev)
    elif map_location is not None or locations:
        place(out, locations, map_location)
    for key, alias in aliases.items():
        if keys is not None and key not in keys:
            continue
        base = out[alias["of"]]
        out[key] = base if alias.get("same_object") else base.view(base.shape)
    if keys is not None or meta is None:
        return {k: out[k] for k in wanted}
    return unflatten(meta["structure"], out)


def _into_existing(
    reader: storage.Reader,
    meta: Mapping[str, Any] | None,
    stored: list[str],
    numpy_keys: set[str],
    locations: Mapping[str, str],
    into: Into,
    map_location: MapLocation,
    verify: bool,
) -> dict[str, torch.Tensor]:
    """The stored values of ``_load`` decoded straight into existing tensors (``into``), as
    ``key -> that tensor``: only values that would come back as CPU tensors (not numpy leaves,
    not moved to another device). The other compressed tensors of such a load are decoded in
    the same batched read, into new tensors (``decode_into_existing``'s ``fresh``)."""
    to_cpu = map_location is not None and is_plain_device(map_location)
    if to_cpu and torch.device(map_location).type != "cpu" or not (to_cpu or map_location is None):
        return {}
    if callable(into):
        skeleton = unflatten(meta["structure"], _NoLeaves()) if meta else None
        tree = into(skeleton)
    else:
        tree = into
    if not tree:
        return {}
    wanted = set(stored)
    targets = {
        k: t
        for k, t in flatten(tree)[0].items()
        if isinstance(t, torch.Tensor)
        and k in wanted
        and k not in numpy_keys
        and (to_cpu or locations.get(k, "cpu") == "cpu")
    }
    from .inplace import decode_into_existing

    fresh = [
        k
        for k in stored
        if k not in targets and k not in numpy_keys and (to_cpu or locations.get(k, "cpu") == "cpu")
    ]
    return decode_into_existing(reader, targets, verify, fresh)


class _NoLeaves(dict[str, Any]):
    """Values for :func:`unflatten` that build a checkpoint's skeleton (every leaf ``None``)."""

    def __missing__(self, key: str) -> None:
        return None


def _numpy_leaves(structure: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()

    def visit(node: Mapping[str, Any]) -> None:
        if "n" in node:
            found.add(node["n"])
        for sub in node.get("l", []) + node.get("t", []):
            visit(sub)
        for _, _, sub in node.get("d", []):
            visit(sub)

    visit(structure)
    return found
