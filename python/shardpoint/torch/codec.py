"""The torch tensor codec: tensors to numpy arrays and back, zero-copy where the bytes allow it,
and the state-dict structure around them. Below ``tensors`` (save/load), ``inplace`` and
``models``, which all speak it.

The storage layer speaks numpy (``shardpoint.storage``). Going through numpy costs nothing for CPU
tensors: ``Tensor.numpy()`` and ``torch.from_numpy`` share memory. numpy has no bfloat16/float8,
so those tensors are reinterpreted through a same-width integer view (``int16``/``uint8``) and the
numpy side uses the ``ml_dtypes`` type of the same name: still no copy. Nested state dicts are
flattened to keys and a structure record (:func:`flatten`/:func:`unflatten`); tensors that share
storage are recorded as aliases and view groups and rebuilt so on load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .. import storage
from ..errors import (
    InvalidArgumentError,
    MetaTensorError,
    SparseTensorError,
    UnknownDTypeError,
    UnsupportedDTypeError,
)
from ..storage.dtypes import carrier_dtype, format_name, numpy_dtype
from ..storage.mapping_kinds import mapping_kind, rebuild_mapping
from ..storage.nested_keys import decode_key, key_tag, put_leaf
from ..storage.objects import has_handler

__all__ = [
    "tensor_to_numpy",
    "tensor_bytes",
    "numpy_to_tensor",
    "reader_tensor",
    "format_dtype",
    "torch_dtype",
    "flatten",
    "unflatten",
    "torch_section",
    "METADATA_KEY",
]

#: name of our section among the checkpoint's metadata sections (``Reader.sections``, beside
#: the user's metadata, never inside it). Checkpoints written before sections existed kept it
#: under this key of the user metadata; :func:`load` still reads those.
METADATA_KEY = "shardpoint.torch"
_META_VERSION = 1

#: torch dtype -> format dtype name (FORMAT.md §4); every dtype with a stable byte layout
_TO_FORMAT: dict[torch.dtype, str] = {
    torch.bool: "bool",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.float8_e4m3fnuz: "float8_e4m3fnuz",
    torch.float8_e5m2fnuz: "float8_e5m2fnuz",
    torch.float8_e8m0fnu: "float8_e8m0fnu",
    torch.float4_e2m1fn_x2: "float4_e2m1fn_x2",
}
_FROM_FORMAT = {v: k for k, v in _TO_FORMAT.items()}
# numpy has no native type for these: view the tensor as a same-width integer (zero-copy)
_VIEW_AS: dict[str, tuple[torch.dtype, type]] = {
    "bfloat16": (torch.int16, np.int16),
    "float8_e4m3fn": (torch.uint8, np.uint8),
    "float8_e5m2": (torch.uint8, np.uint8),
    "float8_e4m3fnuz": (torch.uint8, np.uint8),
    "float8_e5m2fnuz": (torch.uint8, np.uint8),
    "float8_e8m0fnu": (torch.uint8, np.uint8),
    "float4_e2m1fn_x2": (torch.uint8, np.uint8),
}


def format_dtype(dtype: torch.dtype) -> str:
    """The format dtype name of a torch dtype (UnsupportedDTypeError when it has none)."""
    try:
        return _TO_FORMAT[dtype]
    except KeyError:
        raise UnknownDTypeError(
            f"torch dtype {dtype} cannot be stored; supported: "
            + ", ".join(str(d) for d in _TO_FORMAT)
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a format dtype name."""
    try:
        return _FROM_FORMAT[name]
    except KeyError:
        raise UnsupportedDTypeError(f"format dtype {name!r} has no torch equivalent") from None


def tensor_to_numpy(tensor: torch.Tensor, *, carrier: bool = False) -> np.ndarray:
    """A numpy array with the tensor's logical value; shares memory for CPU tensors.

    ``carrier``: bfloat16/float8 as a ``carrier_dtype`` array (a same-width integer dtype
    tagged with the format name), for saves and reads that need only the name and the bytes:
    importing ``ml_dtypes`` 0.7 takes ~0.8 s (its extension registers every type's ufunc
    loops), which every fresh process loading or saving a bfloat16 model would otherwise pay.

    Gradients are detached, lazy conjugate/negative bits are resolved (a copy, only for such
    tensors), and non-CPU tensors are copied to the host. Strides are kept (numpy can express
    them), so the storage layer decides how to lay out non-contiguous tensors.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise SparseTensorError(
            f"{tensor.layout} tensors cannot be stored (dense strided tensors only); call "
            ".to_dense() first"
        )
    if tensor.is_quantized:
        raise UnknownDTypeError(
            f"quantized tensors ({tensor.dtype}) cannot be stored; dequantize them first"
        )
    if tensor.device.type == "meta":
        raise MetaTensorError("meta tensors have no data to store")
    name = format_dtype(tensor.dtype)
    t = tensor.detach()
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        # tensor subclasses (DTensor, FakeTensor...) have no host memory of their own
        as_plain = getattr(t, "full_tensor", None)
        if callable(as_plain):
            t = as_plain()
        else:
            t = t.as_subclass(torch.Tensor)
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if name in _VIEW_AS:
        int_dtype, np_int = _VIEW_AS[name]
        return t.view(int_dtype).numpy().view((carrier_dtype if carrier else numpy_dtype)(name))
    return t.numpy()


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The memory of a contiguous CPU tensor as a flat ``uint8`` array (zero-copy), through
    ``tensor_to_numpy(carrier=True)``: no ``ml_dtypes`` import on a load's reading thread."""
    return tensor_to_numpy(tensor, carrier=True).reshape(-1).view(np.uint8)


def numpy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with ``array`` (bfloat16/float8/fp4 through an integer
    view)."""
    name = format_name(array.dtype) if array.dtype.metadata else array.dtype.name
    if name in _VIEW_AS:
        int_dtype, np_int = _VIEW_AS[name]
        return torch.from_numpy(array.view(np_int)).view(_FROM_FORMAT[name])
    return torch.from_numpy(array)


def reader_tensor(array: np.ndarray) -> torch.Tensor:
    """The converter of ``sp.open(prefix, framework="pt")``: a CPU tensor sharing memory with a
    value read from a checkpoint (bfloat16/float8 included). Read-only arrays (views of a file
    mapped read-only) are copied: torch has no read-only tensors, and a write would fault."""
    if not array.flags.writeable:
        array = array.copy()
    return numpy_to_tensor(array)


# --------------------------------------------------------------------------------------------
# Nested state dicts <-> flat keys
# --------------------------------------------------------------------------------------------


_SCALARS = (str, bytes, int, float, bool, type(None))


def flatten(obj: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(flat, structure)``: ``/``-joined keys to leaves, and a JSON description of the nesting.

    Leaves are tensors, numpy arrays and typed scalars; dicts, lists, tuples and ``torch.Size``
    are structure. Key components are not escaped (a flat key ``"a/b"`` is stored as ``a/b``,
    as users expect); two entries that flatten to the same key raise ``DuplicateKeyError``. The structure records what each leaf was (tensor or numpy array) so
    :func:`unflatten` returns the same kinds of objects.
    """
    flat: dict[str, Any] = {}

    def put(path: list[str], leaf: Any) -> str:
        return put_leaf(flat, "/".join(path), leaf)

    def visit(value: Any, path: list[str]) -> dict[str, Any]:
        if isinstance(value, torch.Tensor):
            return {"v": put(path, value)}
        if isinstance(value, np.ndarray):
            return {"n": put(path, value)}
        if isinstance(value, torch.dtype):
            return {"dt": format_dtype(value) if value in _TO_FORMAT else str(value)}
        if isinstance(value, torch.Size):
            return {"S": list(value)}
        if has_handler(value):
            # numpy scalars, dataclasses, Namespace, sets, enums, OmegaConf configs...: one
            # object entry each (FORMAT.md §6.1), not structure to flatten
            return {"p": put(path, value)}
        if isinstance(value, Mapping):
            items = []
            for k, sub in value.items():
                items.append([str(k), key_tag(k), visit(sub, [*path, str(k)])])
            return {"d": items, **mapping_kind(value)}
        if isinstance(value, list | tuple):
            tag = "l" if isinstance(value, list) else "t"
            return {tag: [visit(sub, [*path, str(i)]) for i, sub in enumerate(value)]}
        # scalars, and anything else: the storage layer stores it as an object entry or
        # raises (before anything is written) naming the key and how to register its type
        return {"p": put(path, value)}

    if not isinstance(obj, Mapping):
        raise InvalidArgumentError(f"expected a mapping (state dict), got {type(obj).__name__}")
    structure = visit(obj, [])
    return flat, structure


def unflatten(structure: Mapping[str, Any], values: Mapping[str, Any]) -> Any:
    """Rebuild the nesting recorded by :func:`flatten` from ``values`` (key -> leaf)."""
    if "d" in structure:
        items = {decode_key(k, tag): unflatten(sub, values) for k, tag, sub in structure["d"]}
        return rebuild_mapping(structure, items)
    if "l" in structure:
        return [unflatten(sub, values) for sub in structure["l"]]
    if "t" in structure:
        return tuple(unflatten(sub, values) for sub in structure["t"])
    if "S" in structure:
        return torch.Size(structure["S"])
    if "dt" in structure:
        name = structure["dt"]
        return _FROM_FORMAT[name] if name in _FROM_FORMAT else getattr(torch, name.split(".")[-1])
    for tag in ("v", "n", "p"):
        if tag in structure:
            return values[structure[tag]]
    raise InvalidArgumentError(f"malformed structure node {structure!r}")


# --------------------------------------------------------------------------------------------
# Shared storage
# --------------------------------------------------------------------------------------------


def _byte_extent(t: torch.Tensor) -> tuple[int, int]:
    """``[start, end)`` byte range of the tensor's elements inside its storage."""
    size = t.element_size()
    start = t.storage_offset() * size
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * size


def _view_record(t: torch.Tensor) -> tuple[str, int, tuple[int, ...], tuple[int, ...]]:
    return (format_dtype(t.dtype), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def _sharing(flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Find tensors that share storage: ``(aliases, groups)`` for the metadata.

    ``aliases`` maps a key to an earlier key holding exactly the same view (same dtype, offset,
    shape, strides): it is not stored again. ``groups`` lists the remaining distinct views of
    one storage with their byte offsets, shapes and strides, so load can rebuild them inside one
    storage. Tensors with lazy conj/neg bits are stored by value (their bytes differ).
    """
    by_storage: dict[tuple[str, int], list[str]] = {}
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            continue
        if (
            value.is_conj()
            or value.is_neg()
            or type(value) not in (torch.Tensor, torch.nn.Parameter)
        ):
            continue
        if value.device.type == "meta" or value.untyped_storage().nbytes() == 0:
            continue
        ptr = value.untyped_storage().data_ptr()
        by_storage.setdefault((str(value.device), ptr), []).append(key)
    aliases: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    for keys in by_storage.values():
        if len(keys) < 2:
            continue
        seen: dict[tuple[Any, ...], str] = {}
        distinct: list[str] = []
        for key in keys:
            rec = _view_record(flat[key])
            if rec in seen:
                aliases[key] = {"of": seen[rec], "same_object": flat[key] is flat[seen[rec]]}
            else:
                seen[rec] = key
                distinct.append(key)
        if len(distinct) < 2:
            continue
        extents = {k: _byte_extent(flat[k]) for k in distinct}
        # align the span start to 16 bytes so every member's offset stays a multiple of its
        # element size (offsets inside the original storage were)
        base = min(s for s, _ in extents.values()) // 16 * 16
        end = max(e for _, e in extents.values())
        members = {}
        for k in distinct:
            t = flat[k]
            members[k] = {
                "byte_offset": extents[k][0] - base,
                "shape": list(t.shape),
                "stride": list(t.stride()),
            }
        groups.append({"nbytes": end - base, "members": members})
    return aliases, {"groups": groups}


def _rebuild_group(group: Mapping[str, Any], out: dict[str, Any], device: torch.device) -> None:
    """Place the loaded members of one shared-storage group into one fresh storage."""
    block = torch.empty(int(group["nbytes"]), dtype=torch.uint8, device=device).untyped_storage()
    for key, rec in group["members"].items():
        if key not in out:
            continue
        src = out[key]
        # Not torch.empty: with torch.use_deterministic_algorithms(True) (Lightning's
        # deterministic=True) it fills new memory, which float4 dtypes do not implement.
        view = torch.tensor([], dtype=torch.uint8, device=device).view(src.dtype)
        offset = int(rec["byte_offset"])
        if offset % src.element_size():
            raise InvalidArgumentError(f"key {key!r}: stored view offset is not element-aligned")
        view.set_(block, offset // src.element_size(), tuple(rec["shape"]), tuple(rec["stride"]))
        # an expanded member (stride 0) holds one element many times: copy_ refuses to write
        # such a tensor, so write its first index along those dimensions (the others are equal)
        dst, val = view, src
        for d, (n, st) in enumerate(zip(view.shape, view.stride(), strict=True)):
            if st == 0 and n > 1:
                dst, val = dst.narrow(d, 0, 1), val.narrow(d, 0, 1)
        dst.copy_(val)
        out[key] = view


# --------------------------------------------------------------------------------------------
# save / load
# --------------------------------------------------------------------------------------------


def torch_section(reader: storage.Reader) -> Mapping[str, Any] | None:
    """Our metadata section of an open checkpoint, or None when :func:`save` did not write it.

    Checkpoints written before metadata sections existed kept it in the user metadata."""
    meta = reader.sections.get(METADATA_KEY)
    if meta is None:
        meta = reader.metadata.get(METADATA_KEY)
    return meta if isinstance(meta, Mapping) else None


def _to_torch(value: Any) -> Any:
    return numpy_to_tensor(value) if isinstance(value, np.ndarray) else value
