"""Model weights beside a trainer checkpoint's shardpoint part, as the framework's own files.

A Hugging Face ``checkpoint-N/`` (or an accelerate ``checkpoint_<i>/``) is also the model people
evaluate and serve: ``from_pretrained``, PEFT, vLLM and ``safetensors`` read its weights files by
name. So the weights are written as those files — ``model.safetensors``, or HF's shards
``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``, PEFT's
``adapter_model.safetensors`` — by :func:`shardpoint.convert.safetensors_io.write_safetensors`
(temp file, fsync, rename), and everything else (optimizer, scheduler, scaler, RNG, loop state)
stays in the compressed shardpoint part. The part is written last and its index commits the
whole checkpoint; its metadata (``MANIFEST_KEY``) records every weight tensor's dtype, shape
and crc32c, so a resume and ``shardpoint verify`` check the weights too.

The record names tensors, not byte offsets: a directory re-sharded by other tools (the
Trainer's ``convert_to_sharded_checkpoint`` test, ``save_pretrained(max_shard_size=...)``)
still verifies, tensor by tensor.

One save is one job: in the caller's thread the part and the weights are encoded and, for
background saves, copied into reused staging buffers (parallel, GIL released); the writer
thread computes the weights' crc32c over the staged copy, writes the weights files, then the
part. A save killed before the part's commit leaves no part index, so the directory is not a
complete checkpoint (``last_complete_checkpoint``), whatever weights files it holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _core, storage
from ..errors import ChecksumMismatchError, CorruptCheckpointError, InvalidArgumentError
from ._state import WRITER_KEY, missing_part

__all__ = [
    "MANIFEST_KEY",
    "WeightsGroup",
    "save_with_weights",
    "read_manifest",
    "verify_weights",
    "load_group",
]

#: metadata key of the part that records the weights files' tensors
MANIFEST_KEY = "shardpoint.weights"
_VERSION = 1
_Item = tuple[str, str, str, tuple[int, ...], np.ndarray]


@dataclass
class WeightsGroup:
    """The weights files of one loadable unit (a model, or one PEFT adapter): written into
    ``where`` (relative to the checkpoint directory; ``""`` is the directory itself).

    ``files`` maps each file name to its tensor names; ``index`` names the weight-map JSON
    of a sharded group (``index_metadata`` goes under its ``"metadata"``). ``kind`` tells the
    loader what the files are: ``"model"`` weights or a PEFT ``"adapter"``."""

    where: str
    files: dict[str, list[str]]
    tensors: dict[str, Any]
    kind: str = "model"
    index: str | None = None
    index_metadata: dict[str, Any] = field(default_factory=dict)
    file_metadata: dict[str, str] = field(default_factory=lambda: {"format": "pt"})

    def directory(self, root: str) -> str:
        return os.path.join(root, self.where) if self.where else root


def _encode(groups: list[WeightsGroup], keep_device: bool) -> tuple[list[_Item], dict[str, Any]]:
    """Host items and device tensors of every group's tensors, keyed ``<group>/<name>``."""
    from ..storage.values import encode
    from ..torch.staging import is_device_tensor
    from ..torch.tensors import tensor_to_numpy

    items: list[_Item] = []
    device: dict[str, Any] = {}
    for g, group in enumerate(groups):
        for name in (n for names in group.files.values() for n in names):
            t = group.tensors[name]
            key = f"{g}/{name}"
            if keep_device and is_device_tensor(t):
                device[key] = t
            else:
                items.append(encode(key, tensor_to_numpy(t)))
    return items, device


def _write_group(root: str, group: WeightsGroup, staged: Mapping[str, _Item], g: int) -> dict:
    """Write one group's files from the staged bytes; its manifest entry."""
    from ..convert.base import Source, Spec
    from ..convert.safetensors_io import write_safetensors

    directory = group.directory(root)
    os.makedirs(directory, exist_ok=True)

    class _Staged(Source):
        format = "staged"

        def __init__(self, names: list[str]) -> None:
            super().__init__(directory)
            self.metadata = dict(group.file_metadata)
            self._names = names

        def specs(self) -> list[Spec]:
            out = []
            for n in self._names:
                _, dtype, _, shape, raw = staged[f"{g}/{n}"]
                out.append(Spec(n, dtype, tuple(shape), raw.nbytes))
            return out

        def read(self, key: str) -> Any:
            from ..storage.dtypes import numpy_dtype

            _, dtype, _, shape, raw = staged[f"{g}/{key}"]
            return raw.view(numpy_dtype(dtype)).reshape(shape)

    tensors: dict[str, Any] = {}
    for fname, names in group.files.items():
        write_safetensors(_Staged(names), os.path.join(directory, fname), progress=False)
        for n in names:
            _, dtype, _, shape, raw = staged[f"{g}/{n}"]
            tensors[n] = {"dtype": dtype, "shape": list(shape), "crc32c": _core.crc32c(raw)}
    if group.index is not None:
        weight_map = {n: f for f, names in group.files.items() for n in names}
        index = {"metadata": dict(group.index_metadata), "weight_map": weight_map}
        _write_text(
            os.path.join(directory, group.index),
            json.dumps(index, indent=2, sort_keys=True) + "\n",
        )
    return {
        "where": group.where,
        "kind": group.kind,
        "files": sorted(group.files),
        "index": group.index,
        "tensors": tensors,
    }


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_with_weights(
    root: str,
    prefix: str,
    part: Any,
    groups: list[WeightsGroup],
    *,
    integration: str,
    blocking: bool = True,
    compression: str | None = "zstd",
    level: int | None = None,
    durable: bool = True,
) -> Any:
    """Write ``groups``' weights files into checkpoint directory ``root``, then the nested state
    ``part`` as checkpoint ``prefix`` recording the weights' crc32c; the part's index commits.
    Returns ``None``, or with ``blocking=False`` the save's future once both are snapshotted."""
    from ..errors import UnsupportedDTypeError
    from ..torch.staging import TorchStagingBuffers, is_device_tensor
    from ..torch.tensors import METADATA_KEY, _prepare, _saver

    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    try:
        payload, meta = _prepare(part, keep_device=not blocking)
        device = {k: v for k, v in payload.items() if is_device_tensor(v)}
        host = {k: v for k, v in payload.items() if k not in device}
        plan, items = storage.plan_save(
            host,
            prefix,
            compression=compression,
            level=level,
            durable=durable,
            _sections={METADATA_KEY: meta},
        )
        w_items, w_device = _encode(groups, keep_device=not blocking)
    except UnsupportedDTypeError as e:
        raise UnsupportedDTypeError(f"{integration} checkpoint {prefix!r}: {e}") from e

    def finish(part_items: list[_Item], weights: list[_Item]) -> None:
        by_key = {it[0]: it for it in weights}
        manifest = [_write_group(root, g, by_key, i) for i, g in enumerate(groups)]
        plan.metadata_json = json.dumps(
            {WRITER_KEY: integration, MANIFEST_KEY: {"version": _VERSION, "groups": manifest}}
        )
        plan.write(part_items, None)

    if blocking:
        finish(items, w_items)
        return None
    n_part = len(items)
    w_keys = [f"\0w/{it[0]}" for it in w_items]  # staging keys: one set for part and weights

    def stage(bufs: TorchStagingBuffers) -> Callable[[], None]:
        renamed = [(k, *it[1:]) for k, it in zip(w_keys, w_items, strict=True)]
        copy, _ = bufs.stage(items + renamed, with_crc=False)
        dev, ready = bufs.stage_devices({**device, **{f"\0w/{k}": v for k, v in w_device.items()}})
        part_dev = [it for it in dev if not it[0].startswith("\0w/")]
        w_dev = [(it[0][3:], *it[1:]) for it in dev if it[0].startswith("\0w/")]
        weights = [(it[0], *c[1:]) for it, c in zip(w_items, copy[n_part:], strict=True)]

        def write() -> None:
            ready()
            finish(copy[:n_part] + part_dev, weights + w_dev)

        return write

    return _saver().submit(stage, new_buffers=TorchStagingBuffers)


# ---------------------------------------------------------------------------------------------
# reading: the record, verification, loads
# ---------------------------------------------------------------------------------------------


def read_manifest(prefix: str, integration: str) -> dict[str, Any] | None:
    """The weights record of part ``prefix``, or ``None`` when its weights are in the part."""
    if not storage.exists(prefix):
        raise missing_part(prefix, integration)
    with storage.open(prefix) as r:
        rec = r.metadata.get(MANIFEST_KEY)
    if rec is None:
        return None
    if not isinstance(rec, Mapping) or rec.get("version") != _VERSION:
        raise CorruptCheckpointError(
            f"{prefix}.index: metadata {MANIFEST_KEY!r} is not a version-{_VERSION} weights record"
        )
    return dict(rec)


def _open(root: str, group: Mapping[str, Any], io: str = "auto") -> Any:
    """An ``HFReader`` over a group's files as they are now: its weight-map JSON if present
    (recorded, or the one a re-sharding left beside the recorded file), else the file."""
    from ..convert.hf import INDEX_SUFFIX, HFReader

    directory = os.path.join(root, group["where"]) if group["where"] else root
    candidates = [group["index"]] if group["index"] else []
    for f in group["files"]:
        candidates += [f.removesuffix(".safetensors") + INDEX_SUFFIX, f]
    for name in candidates:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return HFReader(path, io=io)
    raise CorruptCheckpointError(
        f"{directory}: none of the weights files {sorted(set(candidates))} recorded by the "
        "checkpoint is there (a save killed before its commit, or files removed)"
    )


def _check(reader: Any, name: str, rec: Mapping[str, Any], data: np.ndarray) -> None:
    got = _core.crc32c(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    if got != rec["crc32c"]:
        raise ChecksumMismatchError(
            f"{reader.path}: tensor {name!r}: crc32c {got:#010x}, the checkpoint recorded "
            f"{rec['crc32c']:#010x}: the weights file was changed or damaged"
        )


def _entries(reader: Any, group: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, rec in group["tensors"].items():
        if name not in reader:
            raise CorruptCheckpointError(
                f"{reader.path}: tensor {name!r}, recorded by the checkpoint, is missing"
            )
        info = reader.info(name)
        if info.dtype != rec["dtype"] or list(info.shape) != list(rec["shape"]):
            raise CorruptCheckpointError(
                f"{reader.path}: tensor {name!r} is {info.dtype}{list(info.shape)}, the "
                f"checkpoint recorded {rec['dtype']}{list(rec['shape'])}"
            )
        yield name, rec


def verify_weights(root: str, manifest: Mapping[str, Any]) -> int:
    """Check every recorded weight tensor of checkpoint directory ``root`` (presence, dtype,
    shape, crc32c; in parallel, GIL released). Returns the number of tensors checked."""
    n = 0
    for group in manifest["groups"]:
        # read with pread in the workers, each value checked as it lands: a crc over a mapped
        # view in a worker thread died of SIGBUS if the file was cut during the check
        with _open(root, group, io="pread") as reader:
            todo = list(_entries(reader, group))
            with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
                jobs = [
                    pool.submit(lambda k, r: _check(reader, k, r, reader.get(k)), k, r)
                    for k, r in todo
                ]
                for f in jobs:
                    f.result()
            n += len(todo)
    return n


def load_group(
    root: str, group: Mapping[str, Any], targets: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The tensors of one recorded group as a state dict of CPU tensors, each checked against
    its crc32c. ``targets``: tensors (plain CPU, stored dtype and shape) that receive their
    values in place (one parallel read) and are returned as they are; the others load fresh."""
    from ..torch.tensors import numpy_to_tensor, tensor_to_numpy

    if targets is not None and not isinstance(targets, Mapping):
        raise InvalidArgumentError("targets must be a mapping of names to tensors")
    out: dict[str, Any] = {}
    with _open(root, group) as reader:
        entries = list(_entries(reader, group))
        into: dict[str, np.ndarray] = {}
        for name, rec in entries:
            t = None if targets is None else targets.get(name)
            if _receives(t, rec):
                into[name] = tensor_to_numpy(t)
                out[name] = t
        if into:
            reader.load_into(into)
        for name, rec in entries:
            if name in into:
                _check(reader, name, rec, into[name])
            else:
                arr = np.array(reader.get(name))  # own memory, not the file's mapping
                _check(reader, name, rec, arr)
                out[name] = numpy_to_tensor(arr)
    return out


def _receives(t: Any, rec: Mapping[str, Any]) -> bool:
    import torch

    from ..torch.inplace import _direct

    return isinstance(t, torch.Tensor) and _direct(t.detach(), rec["dtype"])
