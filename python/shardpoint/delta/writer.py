"""Writing a delta checkpoint (``save_file(tree, P, base=B, delta=True)``, FORMAT.md §11).

Per tensor the writer picks the smallest of three encodings against the base's value of the
same key, dtype and shape: ``same`` (identical bytes: an all-zero payload, a few bytes a
chunk), ``xor`` (the XOR of the bit patterns, stored with byte-grouped zstd: the exponent and
high-mantissa planes of a small update are runs of zeros) or whole (an ordinary entry in the
caller's codec). Full and XOR payloads want different codecs (the default bytegroup-Huffman
codec spends at least a bit per byte, ten times what zstd spends on a 99%-zero plane), and a
save has one codec per writer, so the checkpoint is written as a two-writer save (one writer per
codec) merged into one index (FORMAT.md §8): one checkpoint, each entry with its own codec, no
format change.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..storage import Writer, is_url, merge
from ..storage import open as open_checkpoint
from ..storage.dtypes import numpy_dtype
from ..storage.paths import _prefix
from ..storage.save import save_file
from ..storage.values import check_key, encode
from .bits import byte_view, crc32c, same_bytes, xor_bytes
from .table import SECTION, DeltaEntry, DeltaTable, has_payload_key, payload_key

__all__ = ["save_delta", "index_digest", "choose", "XOR_CODEC", "XOR_LEVEL", "DEFAULT_MAX_CHAIN"]

#: the codec of XOR payloads: byte-grouped zstd (runs of zero bytes cost next to nothing)
XOR_CODEC = "zstd-bytegroup"
XOR_LEVEL = 1
#: the longest chain ``save_file(delta=True)`` builds before it writes a full checkpoint
DEFAULT_MAX_CHAIN = 8
#: the bytes of each of a few windows a tensor's encodings are compared on (whole below 2x)
_SAMPLE = 256 << 10
_WINDOWS = 4


def index_digest(prefix: str) -> str:
    """``sha256:<hex>`` of checkpoint ``prefix``'s index file: the digest a delta pins its base
    by (FORMAT.md §11; equal to ``sha256sum prefix.index``)."""
    h = hashlib.sha256()
    with open(prefix + ".index", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _windows(b: np.ndarray, itemsize: int) -> list[np.ndarray]:
    """A few evenly spaced windows of a byte array (the whole array when small)."""
    if b.size <= _WINDOWS * _SAMPLE * 2:
        return [b]
    step = (b.size - _SAMPLE) // (_WINDOWS - 1)
    step -= step % itemsize
    return [b[i * step : i * step + _SAMPLE] for i in range(_WINDOWS)]


def _stored_sizes(
    samples: dict[str, tuple[Any, list[np.ndarray]]], compression: Any, level: Any, tmp: str
) -> dict[str, int]:
    """Stored bytes of each sample set (key -> (dtype, windows)) under one codec, measured by
    writing a scratch checkpoint (the real encoder: no model of it to drift from it)."""
    if not samples:
        return {}
    tree: dict[str, np.ndarray] = {}
    for key, (dtype, wins) in samples.items():
        for i, w in enumerate(wins):
            tree[f"{i}/{key}"] = _typed(w, dtype)
    path = os.path.join(tmp, f"s{len(os.listdir(tmp))}")
    save_file(tree, path, compression=compression, level=level, durable=False)
    out = dict.fromkeys(samples, 0)
    with open_checkpoint(path) as r:
        for name in tree:
            out[name.split("/", 1)[1]] += r.info(name).stored_bytes
    return out


def _typed(b: np.ndarray, dtype: Any) -> np.ndarray:
    return b.view(dtype) if b.size % dtype.itemsize == 0 else b


def choose(
    pairs: Mapping[str, tuple[np.dtype, np.ndarray, np.ndarray]], compression: Any, level: Any
) -> dict[str, str]:
    """The encoding of each key of ``pairs`` (``key -> (dtype, new bytes, base bytes)``):
    ``"same"``, ``"xor"`` or ``"full"``, whichever stores fewer bytes (``xor`` only when it is
    smaller than the whole value on the sampled windows, so a dense change costs at most what
    a full save does, plus the windows' sampling error)."""
    modes: dict[str, str] = {}
    fulls: dict[str, tuple[Any, list[np.ndarray]]] = {}
    xors: dict[str, tuple[Any, list[np.ndarray]]] = {}
    for key, (dtype, nb, ob) in pairs.items():
        if same_bytes(nb, ob):
            modes[key] = "same"
            continue
        wn, wo = _windows(nb, dtype.itemsize), _windows(ob, dtype.itemsize)
        fulls[key] = (dtype, wn)
        xors[key] = (dtype, [xor_bytes(x, y) for x, y in zip(wn, wo, strict=True)])
    with tempfile.TemporaryDirectory(prefix="shardpoint-delta-") as tmp:
        full_sz = _stored_sizes(fulls, compression, level, tmp)
        xor_sz = _stored_sizes(xors, XOR_CODEC, XOR_LEVEL, tmp)
    for key in fulls:
        modes[key] = "xor" if xor_sz[key] < full_sz[key] else "full"
    return modes


def _pairs(
    base: Any, tree: Mapping[str, Any]
) -> dict[str, tuple[np.dtype, np.ndarray, np.ndarray]]:
    """``key -> (dtype, new bytes, base bytes)`` (1-d uint8, little-endian as stored) for the tensor
    keys of ``tree`` that the base holds with the same dtype tag and shape (each base value
    read resolved and crc-checked)."""
    out = {}
    for key, v in tree.items():
        if not isinstance(v, np.ndarray) or key not in base or not has_payload_key(key):
            continue
        _, dtype, _, shape, raw = encode(key, v)
        info = base.info(key)
        if info.kind != "tensor" or tuple(info.shape) != tuple(shape) or info.dtype != dtype:
            continue
        out[key] = (numpy_dtype(dtype), raw, byte_view(np.ascontiguousarray(base[key])))
    return out


def save_delta(
    tensors: Mapping[str, Any],
    prefix: Any,
    *,
    base: Any,
    compression: Any = "zstd",
    level: Any = None,
    metadata: Mapping[str, Any] | None = None,
    durable: bool = True,
    chunk_bytes: int | None = None,
    max_chain: int = DEFAULT_MAX_CHAIN,
    sections: Mapping[str, Any] | None = None,
) -> DeltaTable | None:
    """Save ``tensors`` as a delta checkpoint against checkpoint ``base`` (see the module
    docstring). Returns the delta table written, or ``None`` when the chain below ``base`` is
    already ``max_chain`` long and a full checkpoint was written instead."""
    p, b = _prefix(prefix), _prefix(base)
    if is_url(p) or is_url(b):
        raise InvalidArgumentError(f"{p}: delta saves read and pin a local base checkpoint")
    if type(max_chain) is not int or max_chain < 0:
        raise InvalidArgumentError(f"max_chain must be an int >= 0, got {max_chain!r}")
    tree = {check_key(k): v for k, v in tensors.items()}
    digest = index_digest(b)  # before reading: what was read is what is pinned
    with open_checkpoint(b) as r:
        depth = 1 + int(getattr(r, "delta_depth", 0))
        if depth > max_chain:
            save_file(tree, p, compression=compression, level=level, metadata=metadata,
                      durable=durable, chunk_bytes=chunk_bytes, _sections=sections)  # fmt: skip
            return None
        pairs = _pairs(r, tree)
        modes = choose(pairs, compression, level)
    table = DeltaTable(_relative(b, p), digest, depth)
    for key, mode in modes.items():
        if mode != "full":
            _, nb, ob = pairs[key]
            table.entries[key] = DeltaEntry(mode, crc32c(nb), crc32c(ob))
    all_sections = dict(sections or {})
    all_sections[SECTION] = table.to_json()
    token = os.urandom(8).hex()
    opts: dict[str, Any] = dict(
        durable=durable, chunk_bytes=chunk_bytes, world_size=2, merge_token=token
    )
    with Writer(p, compression=compression, level=level, rank=0, metadata=metadata,
                _sections=all_sections, **opts) as whole:  # fmt: skip
        for key, v in tree.items():
            if key not in table.entries:
                whole.add(key, v)
    with Writer(p, compression=XOR_CODEC, level=XOR_LEVEL, rank=1, **opts) as deltas:
        for key, e in table.entries.items():
            dtype, nb, ob = pairs[key]
            if e.mode == "same":
                payload = np.zeros(nb.shape, np.uint8)  # calloc: zero pages, no memory touched
            else:
                payload = xor_bytes(nb, ob)
            deltas._add(
                payload_key(key), payload.view(dtype).reshape(tree[key].shape), internal=True
            )
            del payload
    merge(p, 2, durable=durable, token=token)
    return table


def _relative(base: str, prefix: str) -> str:
    """The base as recorded: relative to the checkpoint's directory (a directory of checkpoints
    moves as a whole), absolute when they are on different drives."""
    try:
        return os.path.relpath(os.path.abspath(base), os.path.dirname(os.path.abspath(prefix)))
    except ValueError:
        return os.path.abspath(base)
