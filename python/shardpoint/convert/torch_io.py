"""PyTorch ``.pt`` / ``.bin`` / ``.pth`` state dicts as a conversion source.

Files are loaded with ``torch.load(weights_only=True)``: the restricted unpickler that refuses
arbitrary objects, so converting an untrusted file runs no code from it. torch is imported only
here, only when such a file is converted. Files in the zip format (everything ``torch.save``
wrote since 1.6) are memory-mapped, so tensors are read from the page cache one at a time instead
of being loaded twice.

Nested containers are flattened with ``/`` between levels (``{"model": {"w": t}}`` → key
``model/w``; list items by index); tensors become arrays, plain ints/floats/strings/bools become
typed values, anything else is skipped with a note.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import CorruptCheckpointError, NotFoundError, UnsupportedDTypeError
from ..storage.dtypes import format_name, numpy_dtype
from ..storage.nested_keys import put_leaf
from .base import Source, Spec

__all__ = ["TorchSource", "is_torch_file", "tensor_to_numpy"]

_PICKLE_PROTO = b"\x80"


def is_torch_file(path: str) -> bool:
    """A zip archive (``torch.save``'s format) or a legacy pickle stream."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == _PICKLE_PROTO


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A CPU numpy array with the tensor's exact bits (bf16/float8 via ml_dtypes views)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.layout != torch.strided or t.is_quantized:
        raise TypeError(f"{t.layout} / quantized tensors are not supported")
    t = t.contiguous()
    special = {
        torch.bfloat16: (torch.int16, "bfloat16"),
        getattr(torch, "float8_e4m3fn", None): (torch.uint8, "float8_e4m3fn"),
        getattr(torch, "float8_e5m2", None): (torch.uint8, "float8_e5m2"),
    }
    if t.dtype in special:
        as_int, name = special[t.dtype]
        return t.view(as_int).numpy().view(numpy_dtype(name))
    return t.numpy()


class TorchSource(Source):
    """A state dict (or nested dict/list of tensors) saved with ``torch.save``."""

    format = "torch"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        try:
            import torch
        except ImportError as e:
            raise CorruptCheckpointError(
                f"{path}: converting a PyTorch file needs the 'torch' package"
            ) from e
        try:
            mmap = zipfile.is_zipfile(path)  # only the zip format can be memory-mapped
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except FileNotFoundError as e:
            raise NotFoundError(f"{path}: not found") from e
        except Exception as e:  # UnpicklingError, RuntimeError: all mean "not a loadable file"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CorruptCheckpointError(f"{path}: cannot load as a PyTorch file: {first}") from e
        self._values: dict[str, Any] = {}
        self._flatten("", obj)
        self._specs = [self._spec(k, v) for k, v in self._values.items()]

    def _flatten(self, prefix: str, obj: Any) -> None:
        import torch

        if isinstance(obj, torch.Tensor):
            key = prefix or "tensor"
            try:
                arr = tensor_to_numpy(obj)
                format_name(arr.dtype)
            except (TypeError, RuntimeError, UnsupportedDTypeError) as e:
                self.notes.append(f"skipped {key!r}: {obj.dtype}: {e}")
                return
            put_leaf(self._values, key, arr)
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                self._flatten(f"{prefix}/{k}" if prefix else str(k), v)
        elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
            for i, v in enumerate(obj):
                self._flatten(f"{prefix}/{i}" if prefix else str(i), v)
        elif isinstance(obj, (bool, int, float, str, bytes)) or obj is None:
            put_leaf(self._values, prefix or "value", obj)
        else:
            self.notes.append(f"skipped {prefix!r}: {type(obj).__name__} is not a tensor or value")

    @staticmethod
    def _spec(key: str, value: Any) -> Spec:
        if isinstance(value, np.ndarray):
            return Spec(key, format_name(value.dtype), value.shape, value.nbytes)
        kind = {bool: "json", int: "int", float: "float", str: "str", bytes: "bytes"}.get(
            type(value), "json"
        )
        return Spec(key, "uint8", (), 0, kind)

    def specs(self) -> list[Spec]:
        return list(self._specs)

    def read(self, key: str) -> Any:
        return self._values[key]

    def close(self) -> None:
        self._values = {}
