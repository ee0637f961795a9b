"""The key codec of nested state dicts: one tag per dict key, so a key comes back as its type.

A nested state dict (torch's ``optimizer.state_dict()``, a data loader's state) may key its dicts
by ``str``, ``int`` or ``bool``. Where such a dict is flattened into checkpoint entries, each key
is stored as text plus a one-letter tag (``s``, ``i``, ``b``); :func:`decode_key` turns the pair
back into the key. The object graph's state-dict adapter and ``shardpoint.torch`` both record
keys this way, so this module sits below both layers and imports neither.

Every flattening path (the state-dict adapter, ``shardpoint.torch.save``, the ``.pt`` converter)
names a leaf by :func:`flat_key` and stores it through :func:`put_leaf`, so two entries that
flatten to one key (``{"a/b": x, "a": {"b": y}}``, ``{1: x, "1": y}``) raise the same
``DuplicateKeyError`` everywhere instead of one silently replacing the other.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptCheckpointError, DuplicateKeyError, InvalidKeyError

__all__ = ["key_tag", "decode_key", "flat_key", "put_leaf"]


def key_tag(key: Any) -> str:
    """The tag recorded with a nested state-dict key so it comes back as the same type."""
    if isinstance(key, bool):
        return "b"
    if isinstance(key, str):
        return "s"
    if isinstance(key, int):
        return "i"
    raise InvalidKeyError(
        f"state dict keys must be str, int or bool, got {type(key).__name__}: {key!r}"
    )


def decode_key(text: str, tag: str) -> Any:
    """Inverse of :func:`key_tag`; the tag comes from disk, so an unknown one is corruption."""
    if tag == "s":
        return text
    if tag == "i":
        return int(text)
    if tag == "b":
        return text == "True"
    raise CorruptCheckpointError(f"unknown key tag {tag!r} in the stored structure")


def flat_key(path: list[str], default: str = "value") -> str:
    """The checkpoint key of a leaf at ``path``: its components joined by ``/`` (not escaped,
    as users expect), or ``default`` for a leaf at the root."""
    return "/".join(path) if path else default


def put_leaf(flat: dict[str, Any], key: str, leaf: Any) -> str:
    """Store ``leaf`` under ``key`` in ``flat``; a key already there is a DuplicateKeyError."""
    if key in flat:
        raise DuplicateKeyError(
            f"two state dict entries flatten to the same key {key!r} (a key containing '/' "
            "and a nested dict, or an int key and its str, e.g. {1: x, '1': y}); rename one"
        )
    flat[key] = leaf
    return key
