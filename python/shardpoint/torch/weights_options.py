"""The options of ``weights_iterator`` that serving engines pass through their own loader
configuration (vLLM's ``--model-loader-extra-config``, SGLang's ``model_loader_extra_config``):
checked here, with errors that name the engine's setting and list what is accepted, before the
iterator sees them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgumentError
from ..storage.io_mode import check_io

__all__ = ["LOADER_OPTIONS", "loader_options", "check_direct"]

#: The options an engine loader built on this iterator takes, with their types.
LOADER_OPTIONS: dict[str, str] = {
    "threads": "a positive int: decoding threads (default: one per CPU)",
    "io": "'auto', 'mmap' or 'pread', as for sp.open",
    "window": "a positive int: bytes read ahead of the engine at most",
    "verify": "true/false: check the crc32c of uncompressed values too (default true)",
    "direct": "true/false/'cold'/'auto': O_DIRECT cold reads of Hugging Face files and local "
    "shardpoint checkpoints; 'cold' (the default) reads direct when a large local read is "
    "mostly not in the page cache; 'auto' times both routes on the first values of a large "
    "cold file and keeps direct only where it clearly wins",
    "consumer_threads": "a positive int or null: the engine thread's torch intra-op threads "
    "while it loads (default 1; null leaves them alone)",
}


def check_direct(direct: object) -> bool | str:
    """``direct`` as ``weights_iterator`` takes it (``True``, ``False``, ``"cold"`` or
    ``"auto"``); anything else raises ``InvalidArgumentError``."""
    if isinstance(direct, bool):
        return direct
    if isinstance(direct, str) and direct in ("cold", "auto"):
        return direct
    raise InvalidArgumentError(f"direct must be True, False, 'cold' or 'auto', got {direct!r}")


def loader_options(extra: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """The :func:`weights_iterator` keywords of an engine's extra loader config; unknown keys
    and bad values raise ``ValueError`` naming ``where`` and what is accepted."""
    out: dict[str, Any] = {}
    if not extra:
        return out
    if not isinstance(extra, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(LOADER_OPTIONS))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in LOADER_OPTIONS.items())
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} ({allowed})")
    for key, value in extra.items():
        if key == "threads":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: threads must be a positive int, got {value!r}")
        elif key == "io":
            try:
                check_io(value)
            except InvalidArgumentError as e:
                raise ValueError(f"{where}: {e}") from None
        elif key == "window":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: window must be a positive int (bytes), got {value!r}")
        elif key == "consumer_threads":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"{where}: consumer_threads must be a positive int or null, got {value!r}"
                )
        elif key == "direct" and not (isinstance(value, bool) or value in ("cold", "auto")):
            raise ValueError(
                f'{where}: direct must be true, false, "cold" or "auto", got {value!r}'
            )
        elif key == "verify" and not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
        out[key] = value
    return out
