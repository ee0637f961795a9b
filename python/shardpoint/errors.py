"""The exception tree of shardpoint (the class names are part of the public API).

Every error raised by shardpoint derives from :class:`CheckpointError`. Leaves also
inherit the builtin that callers would naturally catch, so ``except FileNotFoundError``
and ``except KeyError`` keep working.
"""

from __future__ import annotations

import pickle

__all__ = [
    "CheckpointError",
    "NotFoundError",
    "CorruptCheckpointError",
    "ChecksumMismatchError",
    "UnsupportedFormatError",
    "UnregisteredTypeWarning",
    "MissingKeyError",
    "DuplicateKeyError",
    "UnsupportedDTypeError",
    "UnknownDTypeError",
    "SparseTensorError",
    "MetaTensorError",
    "UnregisteredTypeError",
    "InvalidKeyError",
    "InvalidArgumentError",
    "InvalidSliceError",
    "DeviceUnavailableError",
    "PickleRefusedError",
    "CheckpointIOError",
    "TierError",
    "DigestMissingError",
    "DigestMismatchError",
    "BaseMismatchError",
    "SignatureError",
    "SignatureMissingError",
]


class CheckpointError(Exception):
    """Base class of every error raised by shardpoint."""


class NotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint, its index or one of its shard files does not exist."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """The bytes on disk are not a valid checkpoint (truncated, overwritten, hostile)."""


class ChecksumMismatchError(CorruptCheckpointError):
    """A crc32c checksum recorded in the checkpoint does not match the stored bytes."""


class UnsupportedFormatError(CorruptCheckpointError):
    """The file was written by a newer format version than this library reads."""


class MissingKeyError(CheckpointError, KeyError):
    """A key asked for is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable
        return str(self.args[0]) if self.args else ""


class DuplicateKeyError(CheckpointError, ValueError):
    """The same key was written twice (within one save or across writers)."""


class UnsupportedDTypeError(CheckpointError, TypeError):
    """A value has a dtype or type that the format cannot store."""


class UnknownDTypeError(UnsupportedDTypeError, KeyError):
    """A tensor's dtype has no format equivalent (``torch.complex32``, quantized dtypes...).

    Also a ``KeyError``: ``safetensors.torch`` raises ``KeyError`` for the same mistake."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable
        return str(self.args[0]) if self.args else ""


class SparseTensorError(UnsupportedDTypeError, ValueError):
    """A sparse (non-strided) tensor was given where dense data is stored.

    Also a ``ValueError``: ``safetensors.torch`` raises ``ValueError`` for the same mistake."""


class MetaTensorError(UnsupportedDTypeError, NotImplementedError):
    """A meta tensor (shape and dtype, no data) was given to be stored.

    Also a ``NotImplementedError`` (so a ``RuntimeError``): what ``safetensors.torch`` lets
    through from torch ("Cannot copy out of meta tensor") for the same mistake."""


class UnregisteredTypeError(UnsupportedDTypeError, pickle.UnpicklingError):
    """A checkpoint holds an object of a type that is not on the allow-list: it is not built
    (``shardpoint.register_type`` / ``add_safe_types`` allow it; nothing is ever imported
    because a file names it). Also a ``pickle.UnpicklingError``: what ``torch.load`` raises
    for a global that is not allowed, so a caller's ``except pickle.UnpicklingError`` around a
    load catches it either way."""


class UnregisteredTypeWarning(UserWarning):
    """A save stored an object of a type that no load builds until it is allowed
    (``shardpoint.add_safe_types`` or ``torch.serialization.add_safe_globals``): warned once
    per type per process, at save time rather than at resume time."""


class InvalidKeyError(CheckpointError, TypeError):
    """A key is not a non-empty string of at most 65535 UTF-8 bytes without NUL."""


class InvalidArgumentError(CheckpointError, ValueError):
    """An argument is out of range or inconsistent (bad shape, option, shard count...)."""


class InvalidSliceError(InvalidArgumentError, IndexError):
    """An index of ``Reader.get_slice(key)[...]`` is out of range or of a kind that is not
    supported (an ``IndexError``, as numpy raises for out-of-range indices)."""


class DeviceUnavailableError(InvalidArgumentError, RuntimeError):
    """``map_location`` (or the location a tensor was saved on) names a device this process
    does not have (CUDA on a CPU-only machine, a device index past the count). Also a
    ``RuntimeError`` with ``torch.load``'s own words, so a caller's ``except RuntimeError`` and
    a test's match on "Attempting to deserialize object on a CUDA device" keep working."""


class PickleRefusedError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint holds pickled data and the caller did not opt in with ``allow_pickle=True``
    (unpickling runs code chosen by whoever wrote the file)."""


class TierError(CheckpointError, RuntimeError):
    """A tiered save did not commit on every rank (a peer failed to write or replicate its
    part, or died mid-save), or no tier holds a step complete for every rank when one was
    required. The message names the ranks and what they reported (docs/TIERS.md)."""


class CheckpointIOError(CheckpointError, OSError):
    """The operating system refused a read or write (disk full, permissions, I/O error)."""


class DigestMissingError(CheckpointError, ValueError):
    """A strong check was asked for (``verify(strong=True)``) but the checkpoint was saved
    without a digest manifest: there is nothing stronger than its crc32c to check."""


class DigestMismatchError(CorruptCheckpointError):
    """A file's strong digest (SHA-256/BLAKE3) differs from the manifest recorded at save time,
    or the root digest differs from the one expected: the bytes changed after they were written."""


class BaseMismatchError(DigestMismatchError):
    """A delta checkpoint's (or weight-sync delta's) base is not the one it was made against:
    its digest (or a value's crc32c) differs from the one recorded (docs/DELTA.md)."""


class SignatureError(CheckpointError, ValueError):
    """A checkpoint's signature does not verify: a file changed, was added or removed after
    signing, or the signature was made with another key."""


class SignatureMissingError(SignatureError):
    """A signature check was asked for but the checkpoint has no signature file."""
