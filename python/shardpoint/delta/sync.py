"""Weight sync: the change between two states as a delta file or bytes (:func:`encode`),
applied in place to a receiver's arrays or tensors (:func:`apply`), e.g. from an RL trainer to
its inference workers.

A sync delta is a single-file checkpoint (FORMAT.md §10) with a delta table (§11) whose base is
not a checkpoint but the receiver's state, pinned by :func:`state_digest` (of the base values'
crc32c). :func:`apply` checks the receiver's values against it before touching anything and
each rebuilt value against its recorded crc32c after; a value that fails is XORed back (XOR is
its own inverse), so a failed apply leaves that value as it was.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np

from .. import _core
from ..errors import BaseMismatchError, ChecksumMismatchError, InvalidArgumentError
from ..storage import open as open_checkpoint
from ..storage.dtypes import numpy_dtype
from ..storage.save import write_single
from ..storage.values import check_key
from ..storage.values import encode as encode_value
from .bits import byte_view
from .choice import XOR_CODEC, XOR_LEVEL, choose
from .reader import DeltaReader
from .table import SECTION, DeltaEntry, DeltaTable, has_payload_key, payload_key

__all__ = ["encode", "apply", "state_digest"]


def _is_torch(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "untyped_storage")


def _flat(key: str, v: Any) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(dtype name, shape, 1-d uint8 bytes) of a numpy array or a torch tensor (a CPU copy for
    tensors on a device)."""
    if _is_torch(v):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        import torch  # a torch tensor was given: torch is there

        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        return str(t.dtype).removeprefix("torch."), tuple(t.shape), raw
    if not isinstance(v, np.ndarray):
        raise InvalidArgumentError(
            f"key {key!r}: delta values are numpy arrays or torch tensors, not {type(v).__name__}"
        )
    _, dtype, _, shape, raw = encode_value(key, v)
    return dtype, tuple(shape), raw


def state_digest(crcs: Mapping[str, int]) -> str:
    """``state:<hex>``: SHA-256 of the sorted ``key, crc32c`` pairs of a state's values: what a
    sync delta pins its base (the receiver's state) by."""
    h = hashlib.sha256()
    for key in sorted(crcs):
        h.update(key.encode("utf-8", "surrogatepass") + b"\0" + b"%08x\n" % crcs[key])
    return "state:" + h.hexdigest()


def encode(
    old: Mapping[str, Any], new: Mapping[str, Any], path: str | os.PathLike[str] | None = None
) -> bytes | None:
    """The change from state ``old`` to state ``new`` (``key -> array or tensor``): written to
    ``path`` (a single-file checkpoint), or returned as bytes when ``path`` is None.

    Each key of ``new`` is stored as ``same`` (bytes unchanged: a payload of a few bytes),
    ``xor`` (the XOR of its bits with ``old``'s, byte-grouped and zstd-coded) or whole (a key
    that is new, changed dtype or shape, or whose XOR would not be smaller); keys of ``old``
    missing from ``new`` are listed as removed."""
    tensors = {check_key(k): v for k, v in new.items() if _is_torch(v) or isinstance(v, np.ndarray)}
    flat_new = {k: _flat(k, v) for k, v in tensors.items()}
    pairs, whole = {}, {k: v for k, v in new.items() if k not in tensors}
    for key, (dtype, shape, raw) in flat_new.items():
        if (
            key in old
            and has_payload_key(key)
            and (_is_torch(old[key]) or isinstance(old[key], np.ndarray))
        ):
            od, oshape, oraw = _flat(key, old[key])
            if (od, oshape) == (dtype, shape):
                pairs[key] = (numpy_dtype(dtype), raw, oraw)
                continue
        whole[key] = raw.view(numpy_dtype(dtype)).reshape(shape)
    choices = choose(pairs, XOR_CODEC, XOR_LEVEL)
    table = DeltaTable(None, "", 1, removed=[k for k in old if k not in new])
    tree: dict[str, Any] = dict(whole)
    # payloads are the new values with an XOR base: the core XORs each chunk as it encodes it
    # (a "same" key against itself: zeros, never a fresh all-zero array to fault in)
    bases: dict[str, np.ndarray] = {}
    for key, c in choices.items():
        np_dtype, nb, ob = pairs[key]
        value = nb.view(np_dtype).reshape(flat_new[key][1])
        if c.mode == "full":
            tree[key] = value
            continue
        table.entries[key] = DeltaEntry(c.mode, c.crc, c.base_crc)
        tree[payload_key(key)] = value
        bases[payload_key(key)] = nb if c.mode == "same" else ob
    table.base_digest = state_digest({k: e.base_crc for k, e in table.entries.items()})
    # in memory when bytes are wanted: no temp file written and read back
    return write_single(
        tree, path, compression=XOR_CODEC, level=XOR_LEVEL, sections={SECTION: table.to_json()},
        xor_bases=bases, _internal_keys=True,
    )  # fmt: skip


class _Target:
    """One receiver value as writable host bytes, written back to its tensor on ``commit``."""

    def __init__(self, key: str, v: Any) -> None:
        self.key, self.value = key, v
        self.device = _is_torch(v) and v.device.type != "cpu"
        if _is_torch(v) and not self.device and v.is_contiguous():
            import torch

            self.dtype, self.shape = str(v.dtype).removeprefix("torch."), tuple(v.shape)
            self.bytes = v.detach().reshape(-1).view(torch.uint8).numpy()  # shares memory
        elif isinstance(v, np.ndarray) and v.flags.c_contiguous and v.flags.writeable:
            self.dtype, self.shape, self.bytes = _flat(key, v)
        else:  # a device tensor or a non-contiguous value: a host copy, written back
            self.dtype, self.shape, raw = _flat(key, v)
            self.bytes = raw.copy()
            self.device = True

    def commit(self) -> None:
        if not self.device:
            return
        if isinstance(self.value, np.ndarray):
            self.value[...] = self.bytes.view(numpy_dtype(self.dtype)).reshape(self.shape)
            return
        import torch

        host = torch.from_numpy(self.bytes).view(self.value.dtype).reshape(self.value.shape)
        with torch.no_grad():
            self.value.copy_(host)


def apply(
    delta: bytes | bytearray | memoryview | str | os.PathLike[str],
    target: MutableMapping[str, Any],
    *,
    check_base: bool = True,
) -> dict[str, int]:
    """Apply a sync delta (bytes, or the path :func:`encode` wrote) in place to ``target``
    (``key -> numpy array or torch tensor``, CPU or device): ``same`` keys are left alone,
    ``xor`` keys XORed in place, whole keys copied in (or inserted, or replaced when their
    dtype or shape changed), removed keys deleted. Returns the count of keys by mode.

    Before anything is written, ``check_base`` (default) checks the receiver's values against
    the state the delta was made from: a different state raises ``BaseMismatchError`` naming
    both digests and the first differing key. After each value is rebuilt its crc32c is
    checked; on a mismatch the value is restored and ``ChecksumMismatchError`` raised.
    """
    if isinstance(delta, (bytes, bytearray, memoryview)):
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            # an anonymous in-memory file: nothing lands on a disk (Linux)
            fd = os.memfd_create("shardpoint-sync-delta")
            try:
                with os.fdopen(os.dup(fd), "wb") as fh:
                    fh.write(delta)
                return _apply(f"/proc/self/fd/{fd}", target, check_base, "delta bytes")
            finally:
                os.close(fd)
        with tempfile.TemporaryDirectory(prefix="shardpoint-sync-") as tmp:
            f = os.path.join(tmp, "delta.sp")
            with open(f, "wb") as fh:
                fh.write(delta)
            return _apply(f, target, check_base, "delta bytes")
    return _apply(os.fspath(delta), target, check_base, os.fspath(delta))


def _apply(
    path: str, target: MutableMapping[str, Any], check_base: bool, where: str
) -> dict[str, int]:
    """:func:`apply` of a delta file (``where`` names it in errors)."""
    with open_checkpoint(path) as r:
        table = getattr(r, "delta_table", None)
        if not isinstance(r, DeltaReader) or table is None or table.base_path is not None:
            raise InvalidArgumentError(
                f"{where}: not a weight-sync delta (shardpoint.delta.encode)"
            )
        plain = r._plain
        targets = {}
        for key in table.entries:
            if key not in target:
                raise BaseMismatchError(
                    f"{where}: key {key!r} of the delta's base is missing from the target"
                )
            t = _Target(key, target[key])
            info = plain.info(payload_key(key))
            if (t.dtype, t.shape) != (info.dtype, tuple(info.shape)):
                raise BaseMismatchError(
                    f"{where}: key {key!r}: target is {t.dtype}{list(t.shape)}, the delta's base "
                    f"was {info.dtype}{list(info.shape)}"
                )
            targets[key] = t
        if check_base:
            keys = list(targets)
            crcs = dict(zip(keys, _core.crc32c_many([targets[k].bytes for k in keys]), strict=True))
            found = state_digest(crcs)
            if found != table.base_digest:
                bad = next(k for k, e in table.entries.items() if crcs[k] != e.base_crc)
                raise BaseMismatchError(
                    f"{where}: the target is state {found}, the delta was made against "
                    f"{table.base_digest} (first differing key: {bad!r})"
                )
        counts = {"same": 0, "xor": 0, "full": 0, "removed": 0}
        for e in table.entries.values():
            counts[e.mode] += 1
        _xor_in(plain, where, table, targets)
        for key in r.keys():
            if key in table.entries:
                continue
            counts["full"] += 1
            _put_whole(plain, key, target)
        for key in table.removed:
            if key in target:
                del target[key]
                counts["removed"] += 1
        return counts


def _xor_in(plain: Any, where: str, table: DeltaTable, targets: dict[str, _Target]) -> None:
    """XOR every ``xor`` key's payload into its target in place (one core call: each chunk
    decoded and XOR-interleaved straight into the target, its crc32c taken while in cache)
    and check each result against its recorded crc32c. A value that fails is XORed back
    (restored) and ``ChecksumMismatchError`` raised for the first; the others are kept."""
    keys = [k for k, e in table.entries.items() if e.mode == "xor"]
    if not keys:
        return
    bufs = [targets[k].bytes for k in keys]
    got = _core.xor_into(plain._core, [payload_key(k) for k in keys], bufs)
    bad = [(k, c) for k, c in zip(keys, got, strict=True) if c != table.entries[k].crc]
    if bad:  # undo: XOR is its own inverse
        _core.xor_into(
            plain._core, [payload_key(k) for k, _ in bad], [targets[k].bytes for k, _ in bad]
        )
    for k in keys:
        if all(k != b for b, _ in bad):
            targets[k].commit()
    if bad:
        key, c = bad[0]
        raise ChecksumMismatchError(
            f"{where}: key {key!r}: rebuilt value has crc32c {c:#010x}, recorded "
            f"{table.entries[key].crc:#010x}; the target value was restored"
        )


def _put_whole(plain: Any, key: str, target: MutableMapping[str, Any]) -> None:
    """Copy a whole value of the delta into ``target[key]``: in place when the target holds a
    value of its dtype and shape, else as a new value of the target's kind."""
    value = plain[key]
    old = target.get(key)
    if old is not None and isinstance(value, np.ndarray):
        t = _Target(key, old)
        if (t.dtype, t.shape) == (plain.info(key).dtype, value.shape):
            t.bytes[...] = byte_view(np.ascontiguousarray(value))
            t.commit()
            return
    if old is not None and _is_torch(old) and isinstance(value, np.ndarray):
        from ..storage.frameworks import framework_converter

        convert = framework_converter("pt")
        assert convert is not None
        target[key] = convert(value).to(old.device)
        return
    target[key] = value
