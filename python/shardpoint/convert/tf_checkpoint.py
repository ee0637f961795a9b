"""Restore a checkpoint written by TensorFlow (``tf.train.Checkpoint``/``CheckpointManager``,
TensorBundle format) into live shardpoint trackables, without TensorFlow.

The TensorBundle is read by :mod:`.tensorbundle`; its object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``)
by :mod:`.tf_object_graph`; the graph is then matched against the live objects by the same
restore machinery as shardpoint's own checkpoints (edge by edge from the root, deferred restore
for objects that do not exist yet, ``.OPTIMIZER_SLOT`` slots through the slot protocol), so the
result is an ordinary :class:`~shardpoint.objgraph.load_status.CheckpointLoadStatus`.

Objects the target lacks stay unmatched, as with TensorFlow's ``expect_partial()``: nothing of
theirs is read. State that only TensorFlow can rebuild (a ``tf.data`` iterator's position, saved
as a ``DT_VARIANT`` tensor under its attribute's key plus ``_STATE``; string or resource values)
is reported as not restorable by ``assert_consumed()`` and refused if the target has an object
there; it is never taken for a damaged checkpoint. TensorFlow stores a saveable of several
tensors under its attribute's key plus a suffix each (``ITERATOR`` -> ``ITERATOR_STATE``), so a
graph key missing from the index but prefixing such entries is that saveable, not corruption.

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

import bisect
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ChecksumMismatchError, CorruptCheckpointError, NotFoundError
from ..objgraph.checkpoint_state import latest_checkpoint
from ..objgraph.errors import DTypeMismatchError, LoadStatusError
from ..objgraph.load_status import CheckpointLoadStatus
from ..objgraph.restore import RestoreCoordinator
from ..objgraph.trackable import Trackable
from .tensorbundle import (
    TF_DTYPES,
    TF_OTHER_DTYPES,
    BundleEntry,
    TensorBundleReader,
    crc32c,
    unmask_crc,
)
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
_DT_VARIANT = 21


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


_ITERATOR_ATTRIBUTE = "/.ATTRIBUTES/ITERATOR"


class _BundleValues:
    """The reader face :class:`RestoreCoordinator` needs, over a TensorBundle: ``info(key)``,
    ``reader[key]`` (crc32c-checked), ``key in reader``, ``close()``."""

    def __init__(self, prefix: str) -> None:
        self.bundle = TensorBundleReader(prefix)
        self._sorted_keys: list[str] | None = None

    def _parts(self, key: str) -> list[BundleEntry]:
        """The entries TensorFlow stored for the saveable whose attribute key is ``key`` when
        it saved several tensors (each under ``key`` + a suffix; a tf.data iterator saves one,
        ``ITERATOR_STATE``). Only asked for keys that are not in the index themselves."""
        if self._sorted_keys is None:  # built once, on the first such key (rare)
            self._sorted_keys = sorted([*self.bundle.entries, *self.bundle.skipped])
        keys = self._sorted_keys
        out = []
        for i in range(bisect.bisect_right(keys, key), len(keys)):
            if not keys[i].startswith(key):
                break
            out.append(self.bundle.entries.get(keys[i]) or self.bundle.skipped[keys[i]])
        return out

    def __contains__(self, key: str) -> bool:
        return key in self.bundle.entries or key in self.bundle.skipped or bool(self._parts(key))

    def unrestorable(self, key: str) -> str | None:
        """Why the value under ``key`` cannot be restored without TensorFlow (a tf.data
        iterator's state, a string, resource or variant value), or ``None`` when it can (or
        when ``key`` is not in the checkpoint at all)."""
        if key in self.bundle.entries:
            return None
        skipped = self.bundle.skipped.get(key)
        parts = [skipped] if skipped is not None else self._parts(key)
        if not parts:
            return None
        stored = ", ".join(
            f"{p.key!r} ({TF_OTHER_DTYPES.get(p.dtype, TF_DTYPES.get(p.dtype, p.dtype))})"
            for p in parts
        )
        if key.endswith(_ITERATOR_ATTRIBUTE) or all(p.dtype == _DT_VARIANT for p in parts):
            what = "a tf.data iterator's state" if key.endswith(_ITERATOR_ATTRIBUTE) else None
            what = what or "a TensorFlow variant value"
            return (
                f"{what}, stored as {stored}: only TensorFlow can rebuild it (shardpoint restores "
                "no iterator position; restart the input pipeline, or skip the batches already "
                "seen)"
            )
        if len(parts) > 1 or parts[0].key != key:
            return f"a TensorFlow object saved as several tensors ({stored}), not one value"
        return f"a TensorFlow value shardpoint does not convert, stored as {stored}"

    def info(self, key: str) -> _Info:
        entry = self.bundle.entries.get(key)
        if entry is not None:
            crc = unmask_crc(entry.crc32c_masked)
            return _Info(entry.shape, TF_DTYPES[entry.dtype], "tensor", crc)
        skipped = self.bundle.skipped.get(key)
        parts = [skipped] if skipped is not None else self._parts(key)
        if not parts:
            raise KeyError(key)
        dtype = "+".join(str(TF_OTHER_DTYPES.get(p.dtype, p.dtype)) for p in parts)
        return _Info(parts[0].shape if len(parts) == 1 else (), dtype, "unsupported")

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
        why = self.reader.unrestorable(key)
        if why is not None:
            raise DTypeMismatchError(
                f"Checkpoint key {key!r} holds {why}; it cannot be restored into "
                f"{self.paths[node]} ({type(obj).__name__})."
            )
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


class TFCheckpointLoadStatus(CheckpointLoadStatus):
    """The load status of a TensorFlow checkpoint: ``assert_consumed()`` names the values only
    TensorFlow can rebuild (a tf.data iterator's position) as such when no object took them."""

    def __init__(
        self, coordinator: RestoreCoordinator, root: Trackable, unrestorable: dict[str, str]
    ) -> None:
        super().__init__(coordinator, root)
        self._unrestorable = unrestorable

    def assert_consumed(self) -> CheckpointLoadStatus:
        c = self._coordinator
        for node in c.unresolved_nodes():
            keys = [a["key"] for a in c.nodes[node]["attributes"]]
            why = [self._unrestorable[k] for k in keys if k in self._unrestorable]
            if why:
                raise LoadStatusError(
                    f"Unresolved object in checkpoint {c.paths[node]}: its values {keys} are not "
                    f"restorable without TensorFlow: {'; '.join(why)}. The other values were "
                    "restored; status.assert_existing_objects_matched() checks them, "
                    "status.expect_partial() silences this."
                )
        return super().assert_consumed()


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
        unrestorable = {
            a["key"]: why
            for node in document["nodes"]
            for a in node["attributes"]
            if (why := values.unrestorable(a["key"])) is not None
        }
    except BaseException:
        values.close()
        raise
    coordinator = _TFRestoreCoordinator(values, document, prefix, root, _BundleValues)
    status = TFCheckpointLoadStatus(coordinator, root, unrestorable)
    coordinator.bind_and_restore(0, root)
    if hasattr(root, "save_counter"):
        _ = root.save_counter  # an sp.Checkpoint creates it now; restored if the graph has one
    return status
