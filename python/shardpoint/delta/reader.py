"""Reading a delta checkpoint: :class:`DeltaReader`, what ``sp.open``/``load_file`` return for
a checkpoint with a delta table (FORMAT.md §11).

Delta payloads are stored under reserved keys (``payload_key``: FORMAT.md §11), so an older
reader finds nothing under the user's key; this reader maps them back: ``keys()``, ``in``,
``info``, reads, slices and ``load_into`` see the user's keys only.

Each value is resolved lazily, per key, when it is read: a ``same`` key is read from the base,
an ``xor`` key is its payload XOR the base's value (the base resolved the same way, so a chain
costs one read per link), every other key is an ordinary entry. The base is opened on first use
and refused unless its index digest is the one recorded. Whole values (``r[key]``, ``load``,
``load_into``) are checked against the crc32c of the reconstructed value, so a wrong or damaged
base raises instead of yielding a wrong tensor; slices read only the chunks they need from the
payload and the base (both crc-checked chunk by chunk, the base pinned by its digest).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import _core
from ..errors import (
    BaseMismatchError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    InvalidArgumentError,
    InvalidKeyError,
    MissingKeyError,
    NotFoundError,
)
from ..storage import Reader
from ..storage import open as open_checkpoint
from ..storage.dtypes import numpy_dtype
from ..storage.reader import EntryInfo, stats_dict
from ..storage.slicing import LazySlice
from ..storage.values import RESERVED_KEY_PREFIX, check_key
from .bits import byte_view, crc32c, xor_into
from .table import SECTION, DeltaTable, parse, payload_key
from .writer import index_digest

__all__ = ["DeltaReader", "as_delta_reader"]


def as_delta_reader(r: Reader) -> Reader:
    """``r`` itself, or a :class:`DeltaReader` over the same open checkpoint when its metadata
    holds a delta table (the hook ``sp.open`` calls)."""
    if SECTION not in r.sections:
        return r
    d = DeltaReader.__new__(DeltaReader)
    d.__dict__.update(r.__dict__)
    d._attach(parse(r.sections[SECTION], f"{r.path}.index"))
    return d


class DeltaReader(Reader):
    """A :class:`~shardpoint.storage.Reader` of a delta checkpoint (see the module docstring).
    ``delta_table`` is its parsed table, ``delta_depth`` the length of its chain, ``base`` the
    base opened on first use."""

    delta_table: DeltaTable
    _plain: Reader
    _base_reader: Reader | None

    def _attach(self, table: DeltaTable) -> None:
        self.delta_table = table
        self._base_reader = None
        self._base_checked: set[str] = set()
        plain = Reader.__new__(Reader)  # the same checkpoint, read without resolution
        plain.__dict__.update(self.__dict__)
        plain._out = None
        self._plain = plain
        self._check_layout()

    def _check_layout(self) -> None:
        """Every delta key has its payload under its reserved key and no whole entry, and no
        other reserved key exists (a forged table cannot show a payload as a value)."""
        core, where = self._plain._core, f"{self.path}.index"
        stored = set(core.keys_with_prefix(RESERVED_KEY_PREFIX))
        want = {payload_key(k) for k in self.delta_table.entries}
        for k in sorted(want - stored)[:1]:
            raise CorruptCheckpointError(
                f"{where}: delta key {k[len(payload_key('')) :]!r} has no payload entry {k!r}"
            )
        for k in sorted(stored - want)[:1]:
            raise CorruptCheckpointError(f"{where}: reserved key {k!r} is not in the delta table")
        for k in self.delta_table.entries:
            if k in core:
                raise CorruptCheckpointError(
                    f"{where}: key {k!r} is stored both whole and as a delta"
                )

    # -- keys: the user's, payloads mapped back ---------------------------------------------

    def _plain_key(self, key: str) -> str:
        """``key`` for a read of an ordinary entry: reserved keys are not the user's."""
        if key.startswith(RESERVED_KEY_PREFIX):
            raise MissingKeyError(f"key {key!r} is not in checkpoint {self.path}.index")
        return key

    def _sorted(self, plain: Iterable[str], delta: Iterable[str]) -> list[str]:
        keys = [k for k in plain if not k.startswith(RESERVED_KEY_PREFIX)]
        keys.extend(delta)
        return sorted(keys, key=lambda k: k.encode("utf-8"))  # the index's order

    def keys(self) -> list[str]:
        return self._sorted(self._core.keys(), self.delta_table.entries)

    def prefix(self, key_prefix: str) -> list[str]:
        if not isinstance(key_prefix, str):
            raise InvalidKeyError(f"key prefixes must be str, got {type(key_prefix).__name__}")
        delta = [k for k in self.delta_table.entries if k.startswith(key_prefix)]
        return self._sorted(self._core.keys_with_prefix(key_prefix), delta)

    def __len__(self) -> int:
        return len(self._core)  # one entry per key: payloads replace their keys (checked)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if key in self.delta_table.entries:
            return True
        return not key.startswith(RESERVED_KEY_PREFIX) and key in self._core

    def info(self, key: str) -> EntryInfo:
        """The index record of ``key`` (a delta key: its payload's record under its name)."""
        check_key(key)
        if key in self.delta_table.entries:
            return dataclasses.replace(super().info(payload_key(key)), key=key)
        return super().info(self._plain_key(key))

    @property
    def delta_depth(self) -> int:
        """How many checkpoints lie below this one in its chain (a full checkpoint: 0)."""
        return self.delta_table.depth

    def delta_mode(self, key: str) -> str:
        """How ``key`` is stored: ``"same"``, ``"xor"`` or ``"full"``."""
        e = self.delta_table.entries.get(key)
        return "full" if e is None else e.mode

    @property
    def base_path(self) -> str:
        """The base checkpoint's prefix, resolved against this checkpoint's directory."""
        rel = self.delta_table.base_path
        if rel is None:
            raise InvalidArgumentError(
                f"{self.path}: a weight-sync delta has no base checkpoint; "
                "apply it to the receiver's state with shardpoint.delta.apply"
            )
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), rel))

    @property
    def base(self) -> Reader:
        """The base, opened (and its digest checked) on first use."""
        if self._base_reader is None:
            path = self.base_path
            if not os.path.exists(path + ".index"):
                raise NotFoundError(
                    f"{self.path}: base checkpoint {path!r} (recorded as "
                    f"{self.delta_table.base_path!r}) is missing: a delta checkpoint needs it"
                )
            found = index_digest(path)
            if found != self.delta_table.base_digest:
                raise BaseMismatchError(
                    f"{self.path}: base {path!r} changed: its index digest is {found}, the "
                    f"delta was made against {self.delta_table.base_digest}"
                )
            opened = open_checkpoint(path, verify=self._verify, copy=self._copy)
            depth = int(getattr(opened, "delta_depth", 0))
            if depth != self.delta_table.depth - 1:
                # each link is one deeper than its base (the writer's rule): a table that says
                # otherwise could hide a chain longer than any reader follows (MAX_DEPTH)
                opened.close()
                raise CorruptCheckpointError(
                    f"{self.path}.index: delta table records depth {self.delta_table.depth}, "
                    f"but its base {path!r} has depth {depth} (a delta is one deeper than its "
                    "base)"
                )
            self._base_reader = opened
        return self._base_reader

    def _base_for(self, keys: Iterable[str]) -> Reader:
        """The base, once it is known to hold each of ``keys`` with the dtype and shape of its
        payload: a payload is the XOR with (or the sign of sameness with) the base's value of
        the same key, so a base value of another shape would be read as this one's bytes,
        and sliced by its own rows (a value of the wrong shape, silently, or an XOR of
        unequal lengths)."""
        base = self.base
        for key in keys:
            if key in self._base_checked:
                continue
            mine = self.info(key)
            try:
                theirs = base.info(key)
            except KeyError:
                raise CorruptCheckpointError(
                    f"{self.path}.index: delta key {key!r} is not in its base {self.base_path!r}"
                ) from None
            if (theirs.kind, theirs.dtype, tuple(theirs.shape)) != (
                mine.kind,
                mine.dtype,
                tuple(mine.shape),
            ):
                raise CorruptCheckpointError(
                    f"{self.path}.index: delta key {key!r} is {mine.dtype} {tuple(mine.shape)}, "
                    f"its base {self.base_path!r} holds it as {theirs.dtype} "
                    f"{tuple(theirs.shape)}"
                )
            self._base_checked.add(key)
        return base

    def close(self) -> None:
        if self._base_reader is not None:
            self._base_reader.close()
            self._base_reader = None
        super().close()

    # -- whole values ----------------------------------------------------------------------

    def _check(self, key: str, flat: np.ndarray, got: int | None = None) -> None:
        """The reconstructed bytes against the recorded crc32c (always: cheap beside a read);
        ``got``: their crc32c when already known."""
        want = self.delta_table.entries[key].crc
        if got is None:
            got = crc32c(flat)
        if got != want:
            raise ChecksumMismatchError(
                f"{self.path}: key {key!r}: the value rebuilt from base {self.base_path!r} has "
                f"crc32c {got:#010x}, recorded {want:#010x} (wrong or damaged base, or payload)"
            )

    def _base_bytes(self, key: str) -> np.ndarray:
        """A fresh, writable copy of the base's value of ``key`` as 1-d bytes."""
        info = self.info(key)
        out = np.empty(info.raw_bytes, np.uint8)
        self._base_for([key])._read_into([key], [out], True)
        return out

    def _xor_payloads(self, keys: list[str], outs: list[np.ndarray]) -> list[int]:
        """XOR the payloads of ``keys`` into ``outs`` (1-d bytes) in place; their crc32c after.
        Local checkpoints: one core call, each chunk decoded straight into its output with its
        crc taken in cache; object stores: read, XOR, crc."""
        core = self._plain._core
        if isinstance(core, _core.CheckpointReader):
            return list(_core.xor_into(core, [payload_key(k) for k in keys], outs))
        crcs = []
        for key, out in zip(keys, outs, strict=True):
            payload = np.empty_like(out)
            self._plain._read_into([payload_key(key)], [payload], True)
            xor_into(out, payload)
            crcs.append(crc32c(out))
        return crcs

    def _resolved(self, key: str) -> np.ndarray:
        """The value of delta key ``key`` as 1-d bytes, checked."""
        flat = self._base_bytes(key)
        got = None
        if self.delta_table.entries[key].mode == "xor":
            (got,) = self._xor_payloads([key], [flat])
        self._check(key, flat, got)
        return flat

    def _value(self, key: str, verify: bool) -> Any:
        if key not in self.delta_table.entries:
            return super()._value(self._plain_key(key), verify)
        info = self.info(key)
        return self._resolved(key).view(numpy_dtype(info.dtype)).reshape(info.shape)

    def load(
        self, keys: list[str] | None = None, *, verify: bool | None = None,
        progress: bool | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        ks = self.keys() if keys is None else list(keys)
        plain = [self._plain_key(k) for k in ks if k not in self.delta_table.entries]
        got = super().load(plain, verify=verify, progress=progress) if plain else {}
        delta = [k for k in ks if k in self.delta_table.entries]
        if delta:  # resolved in one batch: base values read together, payloads XORed in
            infos = [self.info(k) for k in delta]
            flats = [np.empty(i.raw_bytes, np.uint8) for i in infos]
            self._read_into(delta, flats, True)
            for k, i, f in zip(delta, infos, flats, strict=True):
                got[k] = self._tensor_out(f.view(numpy_dtype(i.dtype)).reshape(i.shape))
        return {k: got[k] for k in ks}

    def _read_into(
        self,
        keys: list[str],
        outs: list[np.ndarray],
        verify: bool,
        threads: int | None = None,
        *,
        buffered: bool = False,
    ) -> None:
        plain = [
            (self._plain_key(k), o)
            for k, o in zip(keys, outs, strict=True)
            if k not in self.delta_table.entries
        ]
        if plain:
            super()._read_into(
                [k for k, _ in plain], [o for _, o in plain], verify, threads, buffered=buffered
            )
        delta = [(k, o) for k, o in zip(keys, outs, strict=True) if k in self.delta_table.entries]
        if not delta:
            return
        keys_d = [k for k, _ in delta]
        base = self._base_for(keys_d)
        base._read_into(keys_d, [o for _, o in delta], True, threads, buffered=buffered)
        xor = [(k, o) for k, o in delta if self.delta_table.entries[k].mode == "xor"]
        xk, xo = [k for k, _ in xor], [o for _, o in xor]
        crcs = dict(zip(xk, self._xor_payloads(xk, xo), strict=True)) if xor else {}
        for key, out in delta:
            self._check(key, out, crcs.get(key))

    def _view_checked_once(self, key: str) -> Any:
        if key in self.delta_table.entries:
            return self._value(key, True)
        return super()._view_checked_once(key)

    # -- partial reads ---------------------------------------------------------------------

    def slice(self, key: str, start: int, stop: int) -> Any:
        if key not in self.delta_table.entries:
            return super().slice(self._plain_key(key), start, stop)
        got = self._base_for([key]).slice(key, start, stop)  # fresh (bases hand out numpy)
        if self.delta_table.entries[key].mode == "xor":
            xor_into(byte_view(got), byte_view(self._plain.slice(payload_key(key), start, stop)))
        return self._tensor_out(got)

    def get_slice(self, key: str) -> LazySlice:
        if key not in self.delta_table.entries:
            return super().get_slice(self._plain_key(check_key(key)))
        return _DeltaSlice(self, key)

    # -- whole-checkpoint passes -----------------------------------------------------------

    def stats(
        self, keys: list[str] | None = None, *, progress: bool | None = None
    ) -> dict[str, dict[str, Any]]:
        if keys is None:
            keys = [k for k in self.keys() if self.info(k).kind == "tensor"]
        plain = [self._plain_key(k) for k in keys if k not in self.delta_table.entries]
        out = super().stats(plain, progress=progress) if plain else {}
        for k in keys:
            if k in self.delta_table.entries:
                info = self.info(k)
                t = _core.stats_buffer(self._resolved(k), info.dtype)
                out[k] = stats_dict(info.dtype, tuple(info.shape), t)
        return {k: out[k] for k in keys}

    def verify(self, *, strong: bool = False, expect: str | None = None) -> Any:
        """Check this checkpoint as :meth:`Reader.verify` does, then its base (the whole chain)
        and every delta value rebuilt against its recorded crc32c."""
        found = super().verify(strong=strong, expect=expect)
        self.base.verify()
        for key in self.delta_table.entries:
            self._resolved(key)
        return found


class _DeltaSlice:
    """``get_slice`` of a delta key: the same selection read from the base and the payload
    (each reading only the chunks it needs) and XORed."""

    def __init__(self, reader: DeltaReader, key: str) -> None:
        self._reader = reader
        self.key = key
        self._payload = reader._plain.get_slice(payload_key(key))
        self.shape = self._payload.shape
        self.dtype = numpy_dtype(reader.info(key).dtype)

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def get_dtype(self) -> str:
        return self._payload.get_dtype()

    def __getitem__(self, index: Any) -> Any:
        base = self._reader._base_for([self.key])
        got = np.ascontiguousarray(base.get_slice(self.key)[index])
        if self._reader.delta_table.entries[self.key].mode == "xor":
            xor_into(byte_view(got), byte_view(np.ascontiguousarray(self._payload[index])))
        return self._reader._tensor_out(got)
