"""The key codec of nested state dicts: one tag per dict key, so a key comes back as its type.

A nested state dict (torch's ``optimizer.state_dict()``, a data loader's state) may key its dicts
by ``str``, ``int`` or ``bool``. Where such a dict is flattened into checkpoint entries, each key
is stored as text plus a one-letter tag (``s``, ``i``, ``b``); :func:`decode_key` turns the pair
back into the key. The object graph's state-dict adapter and ``shardpoint.torch`` both record
keys this way, so this module sits below both layers and imports neither.
"""

from __future__ import annotations

from typing import Any

from .errors import CorruptCheckpointError, InvalidKeyError

__all__ = ["key_tag", "decode_key"]


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
