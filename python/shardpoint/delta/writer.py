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
from .choice import XOR_CODEC, XOR_LEVEL, choose, pool_map
from .table import SECTION, DeltaEntry, DeltaTable, has_payload_key, payload_key

__all__ = ["save_delta", "index_digest", "XOR_CODEC", "XOR_LEVEL", "DEFAULT_MAX_CHAIN"]

#: the longest chain ``save_file(delta=True)`` builds before it writes a full checkpoint
DEFAULT_MAX_CHAIN = 8


def index_digest(prefix: str) -> str:
    """``sha256:<hex>`` of checkpoint ``prefix``'s index file: the digest a delta pins its base
    by (FORMAT.md §11; equal to ``sha256sum prefix.index``)."""
    h = hashlib.sha256()
    with open(prefix + ".index", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _pairs(
    base: Any, tree: Mapping[str, Any], compression: Any
) -> tuple[dict[str, tuple[np.dtype, np.ndarray, np.ndarray]], dict[str, int]]:
    """``key -> (dtype, new bytes, base bytes)`` (1-d uint8, little-endian as stored) for the tensor
    keys of ``tree`` that the base holds with the same dtype tag and shape (each base value
    read resolved and crc-checked), and the whole values' expected stored bytes where known
    (``choice.choose``'s hints: the raw size when whole values are stored uncompressed, else
    the base's stored size of a value it holds whole with a compressing codec)."""
    out, hints = {}, {}
    plain_codec = compression in (None, "none", False)
    mode_of = getattr(base, "delta_mode", lambda key: "full")
    keys, bufs = [], []
    for key, v in tree.items():
        if not isinstance(v, np.ndarray) or key not in base or not has_payload_key(key):
            continue
        _, dtype, _, shape, raw = encode(key, v)
        info = base.info(key)
        if info.kind != "tensor" or tuple(info.shape) != tuple(shape) or info.dtype != dtype:
            continue
        keys.append(key)
        bufs.append(np.empty(info.raw_bytes, np.uint8))
        out[key] = (numpy_dtype(dtype), raw, bufs[-1])
        if plain_codec:
            hints[key] = info.raw_bytes
        elif mode_of(key) == "full" and info.codec != "none":
            hints[key] = info.stored_bytes
    if keys:  # one batched read of every base value, decoded in parallel and checked
        base._read_into(keys, bufs, True)
    return out, hints


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
        pairs, hints = _pairs(r, tree, compression)
        choices = choose(pairs, compression, level, hints=hints)
    table = DeltaTable(_relative(b, p), digest, depth)
    for key, c in choices.items():
        if c.mode != "full":
            table.entries[key] = DeltaEntry(c.mode, c.crc, c.base_crc)
    all_sections = dict(sections or {})
    all_sections[SECTION] = table.to_json()
    token = os.urandom(8).hex()
    opts: dict[str, Any] = dict(
        durable=durable, chunk_bytes=chunk_bytes, world_size=2, merge_token=token
    )
    with Writer(p, compression=compression, level=level, rank=0, metadata=metadata,
                _sections=all_sections, **opts) as whole:  # fmt: skip
        pool_map(lambda key: whole.add(key, tree[key]),
                 [k for k in tree if k not in table.entries])  # fmt: skip
    with Writer(p, compression=XOR_CODEC, level=XOR_LEVEL, rank=1, **opts) as deltas:

        def put(key: str) -> None:
            # the new value with an XOR base: the core XORs each chunk as it encodes it, so no
            # XOR is held whole (a "same" key against itself: zeros)
            dtype, nb, ob = pairs[key]
            base_bytes = nb if table.entries[key].mode == "same" else ob
            value = nb.view(dtype).reshape(tree[key].shape)
            deltas._add(payload_key(key), value, internal=True, xor_base=base_bytes)

        pool_map(put, list(table.entries))
    merge(p, 2, durable=durable, token=token)
    return table


def _relative(base: str, prefix: str) -> str:
    """The base as recorded: relative to the checkpoint's directory (a directory of checkpoints
    moves as a whole), absolute when they are on different drives."""
    try:
        return os.path.relpath(os.path.abspath(base), os.path.dirname(os.path.abspath(prefix)))
    except ValueError:
        return os.path.abspath(base)
