"""``load_into``: decode a checkpoint straight into existing tensors (a model's parameters and
buffers, or any mapping of tensors), without fresh memory.

Why: ``load`` / ``load_model`` return fresh arrays and copy them into the model, so a load pays
the first touch of fresh memory (page faults and the kernel's page clearing; on a VM, pages the
guest has not used lately cost ~0.4 GB/s on the reference machine) plus a second copy. Decoding
into the model's own CPU tensors costs only the decoder (issue 15: 3–6 GB/s on two threads for
the float codec, benches/bench_codec.py "load_into").

What it does not do: ``Module.load_state_dict`` hooks and ``_load_from_state_dict`` overrides
are not run (the values go straight into the tensors). Use :func:`load_model` for modules that
customise loading.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .. import storage
from ..errors import UnsupportedDTypeError
from .codec import format_dtype, numpy_to_tensor, tensor_bytes, torch_dtype, torch_section
from .tied import (
    IncompatibleKeys,
    TiedWeightsConflictError,
    _tied_groups,
    same_values,
    tied_conflict_message,
    torch_keys_message,
)

__all__ = ["load_into", "decode_into_existing"]


def _direct(t: torch.Tensor, stored_dtype: str) -> bool:
    """Whether `t` can be decoded into directly: plain CPU memory in the stored layout."""
    try:
        same_dtype = format_dtype(t.dtype) == stored_dtype
    except UnsupportedDTypeError:
        return False
    return same_dtype and _plain(t)


def _plain(t: torch.Tensor) -> bool:
    """Whether `t` is plain, contiguous, non-empty CPU memory (its dtype aside)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and t.is_contiguous()
        and t.numel() > 0
        and not (t.is_conj() or t.is_neg())
    )


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    """The memory of a plain (``_plain``) tensor as a flat ``uint8`` numpy array, the cheapest
    way: one ``numpy()`` of a byte view, whatever the dtype (bfloat16 and float8 have no numpy
    dtype: ``numpy()`` raising first, then ``tensor_bytes``, cost 2-3 us more per tensor, a
    millisecond on a 300-tensor model)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _all_match(reader: storage.Reader, pairs: list[tuple[torch.Tensor, str]]) -> bool:
    """Whether every ``(tensor, stored key)`` names a stored tensor of exactly the tensor's
    dtype and shape, checked in one core call (``first_mismatch``) instead of one ``info``
    per key; ``False`` when any does not, or the reader has no such call (the caller then
    checks key by key and words the error)."""
    match = getattr(reader, "first_mismatch", None)  # a Hugging Face directory's reader
    if match is None:
        match = getattr(getattr(reader, "_r", None), "first_mismatch", None)
    if match is None or not pairs:
        return False
    names: list[str] = []
    for t, _ in pairs:
        try:
            names.append(format_dtype(t.dtype))
        except UnsupportedDTypeError:
            return False
    try:
        bad = match([k for _, k in pairs], names, [tuple(t.shape) for t, _ in pairs])
    except (TypeError, ValueError):
        return False
    return bad is None


def _read_arrays(reader: storage.Reader, arrays: Mapping[str, np.ndarray], verify: bool) -> None:
    """One batched read of stored ``key -> array`` (arrays checked against their entries:
    contiguous, stored dtype and shape), decoded in parallel straight into the arrays."""
    if arrays:
        reader._read_into(
            list(arrays), [a.reshape(-1).view(np.uint8) for a in arrays.values()], verify
        )


def _overlapping(tensors: Mapping[str, torch.Tensor]) -> set[str]:
    """Keys whose (contiguous, CPU) tensors share any byte with another one's."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), k) for k, t in tensors.items()
    )
    out: set[str] = set()
    end, last = -1, ""
    for start, stop, key in spans:
        if start < end:
            out.update((key, last))
        if stop > end:
            end, last = stop, key
    return out


def decode_into_existing(
    reader: storage.Reader,
    targets: Mapping[str, torch.Tensor],
    verify: bool,
    fresh: Iterable[str] = (),
) -> dict[str, torch.Tensor]:
    """Decode stored values straight into existing tensors where that is exactly a load +
    copy: ``targets`` maps stored keys to tensors (a model's parameters, an optimizer's
    state); those that are plain CPU memory in the stored dtype, shape and layout and share no
    byte with another target are filled by one batched read (parallel, checksums checked),
    and returned as ``key -> tensor``. The others are left alone: the caller reads them into
    fresh tensors as before (other dtypes, devices, layouts, tensor subclasses: the framework's
    own ``load_state_dict`` then casts/copies as it always did). Overlapping targets (two keys,
    one memory) are left to the caller too, so which value lands stays the framework's rule.

    ``fresh``: other keys to read in the same call, each compressed tensor among them into a
    new ``torch.empty`` (returned too). Why: new memory that the decoding threads first touch
    page by page is, on the reference VM, ~2.7x faster than the storage face's fresh outputs
    (800 MB of zstd fp32: 0.7 s vs 1.9 s); uncompressed ones stay zero-copy views, which the
    caller reads.
    """
    chosen: dict[str, torch.Tensor] = {}
    for key, t in targets.items():
        if not isinstance(t, torch.Tensor) or key not in reader:
            continue
        info = reader.info(key)
        if info.kind == "tensor" and tuple(info.shape) == tuple(t.shape) and _direct(t, info.dtype):
            chosen[key] = t
    for key in _overlapping(chosen):
        del chosen[key]
    new: dict[str, torch.Tensor] = {}
    for key in fresh:
        info = reader.info(key)
        if key in chosen or info.kind != "tensor" or info.codec == "none" or not info.raw_bytes:
            continue
        try:
            dtype = torch_dtype(info.dtype)
        except UnsupportedDTypeError:
            continue
        # not torch.empty(shape, dtype): deterministic mode would fill it (float4 cannot)
        new[key] = torch.empty(info.raw_bytes, dtype=torch.uint8).view(dtype).view(info.shape)
    arrays = {k: tensor_bytes(t) for k, t in chosen.items()}
    arrays.update((k, tensor_bytes(t)) for k, t in new.items())
    _read_arrays(reader, arrays, verify)
    return {**chosen, **new}


def load_into(
    target: torch.nn.Module | Mapping[str, torch.Tensor],
    prefix: str | os.PathLike[str],
    *,
    strict: bool = True,
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> IncompatibleKeys:
    """Load checkpoint ``prefix`` into ``target``'s tensors in place.

    Args:
        target: a module (its ``state_dict()``: parameters and buffers, which share memory with
            the module) or a mapping ``name -> tensor``.
        prefix: a checkpoint written by :func:`save` / :func:`save_model` (or any flat one),
            or a Hugging Face safetensors directory or file (read in place, no checksums).
        strict: raise ``RuntimeError`` (torch's wording) when names are missing or unexpected.
        verify: check the crc32c of uncompressed values too (compressed ones always are).
        storage_options: credentials/endpoint/knobs when ``prefix`` is an object-store URL.

    CPU, contiguous tensors whose dtype is the stored one are decoded into directly, in
    parallel; the others (other devices, other layouts, other dtypes) get the value through
    ``Tensor.copy_``, which casts as ``load_state_dict`` does. Tied names (one storage, same
    view) are loaded once, and a name tied to one the checkpoint has is not missing; two
    different stored values for one tied group raise :class:`TiedWeightsConflictError`
    (``strict=False``: the first is loaded, the others are reported unexpected). Shapes
    are checked (``RuntimeError``, torch's "size mismatch" sentence) and missing/unexpected
    names reported before any tensor is written; a checksum error while decoding leaves some
    tensors with new values and others with old ones.

    Returns ``IncompatibleKeys(missing_keys, unexpected_keys)`` like :func:`load_model`.
    """
    return load_into_worded(
        target,
        prefix,
        strict=strict,
        verify=verify,
        storage_options=storage_options,
        keys_message=torch_keys_message,
    )


def load_into_worded(
    target: torch.nn.Module | Mapping[str, torch.Tensor],
    prefix: str | os.PathLike[str],
    *,
    strict: bool = True,
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    keys_message: Callable[[str, Sequence[str], Sequence[str]], str],
) -> IncompatibleKeys:
    """:func:`load_into` whose strict missing/unexpected error is worded by ``keys_message``
    (``(model name, missing, unexpected) -> message``): ``load_model`` words it as
    safetensors does, ``load_into`` as torch's ``load_state_dict``."""
    state: dict[str, torch.Tensor] = dict(
        target.state_dict() if isinstance(target, torch.nn.Module) else target
    )
    name = type(target).__name__
    with storage.open(prefix, storage_options=storage_options) as reader:
        reader._carry = True  # bfloat16/float8 as torch views them: no ml_dtypes import
        meta = torch_section(reader)
        aliases: Mapping[str, Any] = meta.get("aliases", {}) if meta else {}
        stored = set(reader.keys())

        def source(n: str) -> str | None:
            if n in stored:
                return n
            if n in aliases:
                return str(aliases[n]["of"])
            return None

        # Tied names: the first one with a source loads, the others share its memory; a
        # follower stored with a different value is a conflict (one tensor, two values), read
        # and compared before anything is written (stores that keep one name, or an alias,
        # cost nothing here).
        follower: set[str] = set()
        conflicts: list[tuple[str, str]] = []
        for group in _tied_groups(state):
            lead = next((n for n in group if source(n) is not None), None)
            if lead is None:
                continue
            follower.update(n for n in group if n != lead)
            lead_src = str(source(lead))
            for n in group:
                src = source(n)
                if n == lead or src is None or src == lead_src:
                    continue
                if not same_values(
                    reader.get(lead_src, verify=verify), reader.get(src, verify=verify)
                ):
                    conflicts.append((lead, n))
        plan = {n: source(n) for n in state if n not in follower}
        missing = [n for n, s in plan.items() if s is None]
        unexpected = sorted((stored | set(aliases)) - set(state))
        if conflicts and strict:
            raise TiedWeightsConflictError(
                tied_conflict_message(name, conflicts, missing, unexpected)
            )
        unexpected += [n for _, n in conflicts]
        if strict and (missing or unexpected):
            raise RuntimeError(keys_message(name, missing, unexpected))
        direct: dict[str, np.ndarray] = {}
        copied: list[tuple[torch.Tensor, str]] = []
        pairs = [(state[n], src) for n, src in plan.items() if src is not None]
        first: dict[str, torch.Tensor] = {}  # the tensor each directly read value lands in
        if _all_match(reader, pairs):
            # every stored dtype and shape is the target's: only the layout is left to check,
            # and a plain tensor's bytes are all the read needs
            for t, src in pairs:
                if src not in first and _plain(t):
                    first[src] = t
                    direct[src] = _bytes_of(t)
                else:
                    copied.append((t, src))
            plan = {}  # checked: the key-by-key loop below has nothing left to do
        for n, src in plan.items():
            if src is None:
                continue
            t = state[n]
            info = reader.info(src)
            if info.kind != "tensor" or tuple(info.shape) != tuple(t.shape):
                got = list(info.shape) if info.kind == "tensor" else info.kind
                raise RuntimeError(
                    f"Error(s) in loading state_dict for {name}:\n\tsize mismatch for {n}: "
                    f"copying a param with shape {got} from checkpoint, the shape in current "
                    f"model is {t.shape}."
                )
            if _direct(t, info.dtype) and src not in first:
                first[src] = t
                direct[src] = tensor_bytes(t)
            else:
                copied.append((t, src))
        # Shapes, dtypes (_direct) and contiguity are checked above: hand the byte views over.
        _read_arrays(reader, direct, verify)
        with torch.no_grad():
            for t, src in copied:
                # A second target of the same stored value copies from the first one's
                # freshly decoded memory instead of decoding it again.
                value = first.get(src)
                t.copy_(
                    value if value is not None else numpy_to_tensor(reader.get(src, verify=verify))
                )
    return IncompatibleKeys(missing, unexpected)
