"""The compiled fast path for a Hugging Face safetensors header (``rust/src/st_header.rs``):
here so that the conversion sources need not import the compiled module (which the import
contracts see as the package root)."""

from __future__ import annotations

from .. import _core

__all__ = ["parse_safetensors_header"]


def parse_safetensors_header(
    blob: bytes, data_len: int
) -> tuple[list[tuple[str, str, tuple[int, ...], int, int]], dict[str, str]] | None:
    """``(tensors, metadata)`` of safetensors header ``blob`` (the JSON after the 8-byte
    length) for a data area of ``data_len`` bytes, when every check of
    ``convert/hf_format.py`` passes: tensors as ``(name, dtype, shape, begin, end)`` in the
    file's order. ``None`` when a check fails or the fast path does not take the header (a
    number past 64 bits, ``NaN``, ...): the caller's own checks then decide, naming the fault.
    Why: those checks in Python cost 4-5 us per tensor (a 20,000-tensor header 83-93 ms, 30-34
    ms this way, 19-20 ms for the ``safetensors`` library; docs/HF.md, "Validation")."""
    return _core.parse_safetensors_header(blob, data_len)
