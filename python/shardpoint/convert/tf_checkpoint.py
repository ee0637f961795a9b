"""Restore a checkpoint written by TensorFlow (``tf.train.Checkpoint``/``CheckpointManager``,
TensorBundle format) into live shardpoint trackables, without TensorFlow.

The TensorBundle is read by :mod:`.tensorbundle`; its object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``)
by :mod:`.tf_object_graph`; the graph is then matched against the live objects by the same
restore machinery as shardpoint's own checkpoints (edge by edge from the root, deferred restore
for objects that do not exist yet, ``.OPTIMIZER_SLOT`` slots through the slot protocol), so the
result is an ordinary :class:`~shardpoint.objgraph.restore.CheckpointLoadStatus`.

Two things differ from restoring a shardpoint checkpoint:

* integer values may change width when the value fits (TensorFlow saves Keras's iteration
  counter as int64; Keras 3 on JAX without x64 keeps it as int32); floats are never cast;
* graphs written by tf.keras 2 (``tf_keras``) are translated to Keras 3's names first
  (:func:`translate_keras2`): the new-style optimizer's ``_variables`` list gains Keras 3's
  learning-rate entry at index 1, and the legacy optimizer's ``iter``/``learning_rate`` become
  ``_iterations``/``_learning_rate``. Layer weights saved as ``kernel`` find Keras 3's
  ``_kernel`` through the alias rule of :func:`~shardpoint.objgraph.trackable.private_alias`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ChecksumMismatchError, CorruptCheckpointError, NotFoundError
from ..objgraph.checkpoint_state import latest_checkpoint
from ..objgraph.errors import DTypeMismatchError
from ..objgraph.restore import CheckpointLoadStatus, RestoreCoordinator
from ..objgraph.trackable import Trackable
from .tensorbundle import TF_DTYPES, BundleEntry, TensorBundleReader, crc32c, unmask_crc
from .tf_object_graph import MAX_GRAPH_BYTES, parse_object_graph_proto

__all__ = [
    "OBJECT_GRAPH_KEY",
    "read_object_graph",
    "restore_from_tensorflow",
    "resolve_tf_checkpoint",
    "translate_keras2",
]

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_DT_STRING = 7


def resolve_tf_checkpoint(path: str | os.PathLike[str]) -> str:
    """The checkpoint prefix ``path`` names: itself when ``path.index`` exists, else the latest
    checkpoint of the directory ``path`` (its ``checkpoint`` state file)."""
    path = os.fspath(path)
    if os.path.isfile(path + ".index"):
        return path
    if os.path.isdir(path):
        latest = latest_checkpoint(path)
        if latest is not None:
            return latest
    raise NotFoundError(
        f"{path}: no TensorFlow checkpoint ({path}.index) and no checkpoint directory"
    )


def _skipped_entry(reader: TensorBundleReader, key: str) -> BundleEntry | None:
    """The index entry of ``key``, a tensor the reader does not convert (a string tensor).
    The reader may keep only the first few such entries (its notes are bounded), so when
    ``key`` is not among them the index is searched again (its size was bounded on open)."""
    entry = reader.skipped.get(key)
    if entry is not None or key in reader.entries:
        return entry
    return reader.find_entry(key)


def _read_string_scalar(reader: TensorBundleReader, key: str) -> bytes:
    """The bytes of the scalar string tensor ``key``: TensorBundle stores a string tensor as the
    varint64 length of each element, the masked crc32c of those length bytes (4 bytes), then the
    string bytes; the entry's crc32c covers all of it."""
    entry = _skipped_entry(reader, key)
    where = f"{reader.index_path}: key {key!r}"
    if entry is None:
        raise CorruptCheckpointError(
            f"{reader.index_path}: no {key!r} entry; not an object-based TensorFlow checkpoint "
            "(a name-based TF1 checkpoint cannot be matched by object graph)"
        )
    if entry.dtype != _DT_STRING or entry.shape != ():
        raise CorruptCheckpointError(f"{where}: expected a scalar string tensor")
    if entry.size > MAX_GRAPH_BYTES + 16:
        raise CorruptCheckpointError(
            f"{where}: {entry.size} bytes is too large for an object graph"
        )
    if not 0 <= entry.shard_id < reader.num_shards:
        raise CorruptCheckpointError(f"{where}: shard_id {entry.shard_id} out of range")
    shard = reader.shard_path(entry.shard_id)
    try:
        with open(shard, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if entry.offset + entry.size > size:
                raise CorruptCheckpointError(
                    f"{shard}: {where} bytes [{entry.offset}, {entry.offset + entry.size}) run "
                    f"past the end of the file ({size} bytes)"
                )
            f.seek(entry.offset)
            raw = f.read(entry.size)
    except FileNotFoundError as e:
        raise NotFoundError(f"{shard}: not found (data shard of {reader.index_path})") from e
    length, pos = 0, 0
    shift = 0
    while True:
        if pos >= len(raw) or shift >= 70:
            raise CorruptCheckpointError(f"{shard}: {where}: bad string length at {entry.offset}")
        b = raw[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    if pos + 4 + length != len(raw):
        raise CorruptCheckpointError(
            f"{shard}: {where}: string length {length} does not match the entry's {len(raw)} bytes"
        )
    # TensorFlow checksums the length as a little-endian uint32 (uint64 beyond 4 GiB), not as
    # its varint bytes; the entry's crc32c extends that over the length checksum and the bytes.
    length_crc = crc32c(length.to_bytes(4 if length <= 0xFFFFFFFF else 8, "little"))
    if length_crc != unmask_crc(int.from_bytes(raw[pos : pos + 4], "little")):
        raise ChecksumMismatchError(f"{shard}: {where}: string length checksum mismatch")
    if crc32c(raw[pos:], length_crc) != unmask_crc(entry.crc32c_masked):
        raise ChecksumMismatchError(
            f"{shard}: checksum mismatch at offset {entry.offset} ({where}): the object graph is "
            "damaged"
        )
    return raw[pos + 4 :]


def read_object_graph(reader: TensorBundleReader) -> dict:
    """The object-graph document of an open TensorBundle (see :mod:`.tf_object_graph`)."""
    data = _read_string_scalar(reader, OBJECT_GRAPH_KEY)
    return parse_object_graph_proto(data, where=f"{reader.index_path}: {OBJECT_GRAPH_KEY}")


@dataclass(frozen=True)
class _Info:
    shape: tuple[int, ...]
    dtype: str
    kind: str
    # recorded by the coordinator for values still waiting when it closes the files: a
    # checkpoint written over at the same path is then refused, not half-restored
    crc32c: int | None = None


class _BundleValues:
    """The reader face :class:`RestoreCoordinator` needs, over a TensorBundle: ``info(key)``,
    ``reader[key]`` (crc32c-checked), ``key in reader``, ``close()``."""

    def __init__(self, prefix: str) -> None:
        self.bundle = TensorBundleReader(prefix)

    def __contains__(self, key: str) -> bool:
        return key in self.bundle.entries or key in self.bundle.skipped

    def info(self, key: str) -> _Info:
        entry = self.bundle.entries.get(key)
        if entry is not None:
            crc = unmask_crc(entry.crc32c_masked)
            return _Info(entry.shape, TF_DTYPES[entry.dtype], "tensor", crc)
        skipped = self.bundle.skipped.get(key)
        if skipped is None:
            raise KeyError(key)
        return _Info(skipped.shape, f"TensorFlow DataType {skipped.dtype}", "unsupported")

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.bundle.entries:
            raise DTypeMismatchError(
                f"{self.bundle.index_path}: key {key!r} is not a numeric tensor shardpoint can "
                "read (string, variant or resource values, such as a tf.data iterator's state)"
            )
        return self.bundle.read(key, verify=True)

    def close(self) -> None:
        self.bundle.close()


class _TFRestoreCoordinator(RestoreCoordinator):
    """Restore from a TensorBundle: integer values may change width when every value fits."""

    def _read_checked(self, key: str, shape: Any, dtype: str | None, obj: Any, node: int) -> Any:
        if dtype is not None:
            try:
                info = self.reader.info(key)
            except KeyError:
                info = None
            if info is not None and info.kind == "tensor" and info.dtype != dtype:
                stored, wanted = np.dtype(info.dtype), _np_dtype(dtype)
                if wanted is not None and stored.kind in "iu" and wanted.kind in "iu":
                    value = super()._read_checked(key, shape, None, obj, node)
                    return _narrow(value, wanted, key)
        return super()._read_checked(key, shape, dtype, obj, node)


def _np_dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _narrow(value: np.ndarray, dtype: np.dtype, key: str) -> np.ndarray:
    info = np.iinfo(dtype)
    arr = np.asarray(value)
    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
        raise DTypeMismatchError(
            f"Checkpoint key {key!r}: value out of range for {dtype.name}; not restored"
        )
    return arr.astype(dtype)


def translate_keras2(document: dict) -> dict:
    """Rename tf.keras 2 optimizer edges to Keras 3's, in place (see the module docstring).
    Graphs written by Keras 3 pass unchanged."""
    nodes = document["nodes"]
    for node in nodes:
        children = {c["name"]: c["node"] for c in node["children"]}
        if "iter" in children and "_iterations" not in children and "beta_1" in children:
            # legacy optimizer (tf.keras.optimizers.legacy.*): hyper-parameters as variables
            for child in node["children"]:
                if child["name"] in ("iter", "learning_rate"):
                    child["name"] = "_" + child["name"].replace("iter", "iterations")
        variables = children.get("_variables")
        if variables is None or "_iterations" not in children:
            continue
        lr = children.get("_learning_rate")
        listed = {c["name"]: c["node"] for c in nodes[variables]["children"]}
        if lr is None or listed.get("1") == lr or "0" not in listed:
            continue  # Keras 3: [iterations, learning_rate, ...moments]
        # tf.keras 2 new-style optimizer: [iterations, ...moments]; Keras 3 puts the learning
        # rate at index 1, so every moment moves up by one
        for child in nodes[variables]["children"]:
            if child["name"].isdigit() and int(child["name"]) >= 1:
                child["name"] = str(int(child["name"]) + 1)
    return document


def restore_from_tensorflow(root: Trackable, path: str | os.PathLike[str]) -> CheckpointLoadStatus:
    """Restore the TensorFlow checkpoint at ``path`` (a prefix such as ``ckpt-3``, or a
    directory with a ``checkpoint`` state file) into ``root`` (usually an ``sp.Checkpoint`` with
    the same dependency names as the ``tf.train.Checkpoint`` that wrote it).

    Values of existing objects are assigned now; the others when their objects are created
    (deferred restore). Returns the load status (``assert_consumed`` and friends).
    """
    prefix = resolve_tf_checkpoint(path)
    values = _BundleValues(prefix)
    try:
        document = translate_keras2(read_object_graph(values.bundle))
    except BaseException:
        values.close()
        raise
    coordinator = _TFRestoreCoordinator(values, document, prefix, root, _BundleValues)
    status = CheckpointLoadStatus(coordinator, root)
    coordinator.bind_and_restore(0, root)
    if hasattr(root, "save_counter"):
        _ = root.save_counter  # an sp.Checkpoint creates it now; restored if the graph has one
    return status
