"""dtypes and tensors of each framework the strategies draw for (numpy, torch, jax).

Everything is drawn as numpy arrays first (raw bits, any dtype through ``ml_dtypes``) and then
handed to the framework without a numeric conversion: torch through an integer view
(``shardpoint.torch.numpy_to_tensor``), jax through ``jnp.asarray`` (a copy of the bytes).
A framework is imported only when a strategy for it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import UnsupportedDTypeError
from ..storage.dtypes import format_name, numpy_dtype
from ._bits import NAMES

__all__ = [
    "FRAMEWORKS",
    "LAYOUTS",
    "supported_names",
    "framework_dtype",
    "name_of",
    "layout_base_shape",
    "apply_layout",
]

FRAMEWORKS = ("numpy", "torch", "jax")

#: memory layouts a tensor may be drawn in, simplest first; each is a view of a C-ordered base
LAYOUTS: dict[str, tuple[str, ...]] = {
    "numpy": (
        "contiguous",
        "transposed",
        "strided",
        "fortran",
        "reversed",
        "broadcast",
        "byteswapped",
    ),
    "torch": ("contiguous", "transposed", "strided", "offset", "expanded"),
    "jax": ("contiguous",),
}


def _check(framework: str) -> str:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    return framework


def supported_names(framework: str) -> tuple[str, ...]:
    """The format dtypes ``framework`` holds without conversion, simplest first: every one
    for numpy and torch; for jax those ``jnp.asarray`` keeps (64-bit types only with
    ``jax_enable_x64``; no packed float4)."""
    _check(framework)
    if framework == "numpy":
        return NAMES
    if framework == "torch":
        from ..torch.codec import _FROM_FORMAT

        return tuple(n for n in NAMES if n in _FROM_FORMAT)
    import jax.numpy as jnp

    out = []
    for n in NAMES:
        dt = numpy_dtype(n)
        if dt.metadata:  # packed float4: jax has no two-per-byte type
            continue
        try:
            if jnp.asarray(np.zeros(1, dt)).dtype == dt:
                out.append(n)
        except (TypeError, ValueError):
            continue
    return tuple(out)


def framework_dtype(name: str, framework: str) -> Any:
    """The dtype object of format dtype ``name`` in ``framework``."""
    _check(framework)
    if framework == "torch":
        from ..torch.codec import torch_dtype

        return torch_dtype(name)
    return numpy_dtype(name)


def name_of(dtype: Any) -> str:
    """The format dtype name of a numpy/torch/jax dtype, a numpy type or a name."""
    if isinstance(dtype, str):
        if dtype in NAMES:
            return dtype
        return format_name(np.dtype(dtype))
    mod = type(dtype).__module__.split(".")[0]
    if mod == "torch":
        from ..torch.codec import format_dtype

        return format_dtype(dtype)
    try:
        return format_name(np.dtype(dtype))
    except TypeError as e:
        raise UnsupportedDTypeError(f"not a dtype: {dtype!r}") from e


def layout_base_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the C-ordered base array that ``layout`` views as ``shape``."""
    if not shape:
        return shape
    if layout == "transposed" and len(shape) >= 2:
        return (*shape[:-2], shape[-1], shape[-2])
    if layout == "strided":
        return (*shape[:-1], 2 * shape[-1])
    if layout == "offset":
        return (shape[0] + 1, *shape[1:])
    if layout in ("broadcast", "expanded"):
        return (1, *shape[1:])
    return shape


def _numpy_view(layout: str, base: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if not shape:
        return base
    if layout == "transposed" and len(shape) >= 2:
        return np.swapaxes(base, -1, -2)
    if layout == "strided":
        return base[..., ::2]
    if layout == "fortran":
        return np.asfortranarray(base)
    if layout == "reversed":
        return base[::-1]
    if layout == "broadcast":
        return np.broadcast_to(base, shape)
    if layout == "byteswapped" and base.dtype.itemsize > 1 and base.dtype.kind in "iufc":
        return base.byteswap().view(base.dtype.newbyteorder(">"))
    return base


def _torch_view(layout: str, base: Any, shape: tuple[int, ...]) -> Any:
    if not shape:
        return base
    if layout == "transposed" and len(shape) >= 2:
        return base.transpose(-1, -2)
    if layout == "strided":
        return base[..., ::2]
    if layout == "offset":
        return base[1:]
    if layout == "expanded":
        return base.expand(*shape)
    return base


def apply_layout(framework: str, layout: str, base: np.ndarray, shape: tuple[int, ...]) -> Any:
    """``base`` (C-ordered, of :func:`layout_base_shape`) as a ``framework`` tensor of
    ``shape`` laid out as ``layout``."""
    if framework == "numpy":
        return _numpy_view(layout, base, shape)
    if framework == "torch":
        from ..torch.codec import numpy_to_tensor

        return _torch_view(layout, numpy_to_tensor(np.ascontiguousarray(base)), shape)
    import jax.numpy as jnp

    return jnp.asarray(base)


def converter(framework: str) -> Callable[[np.ndarray], Any]:
    """numpy array -> contiguous ``framework`` tensor with the same bits."""
    return lambda a: apply_layout(framework, "contiguous", np.ascontiguousarray(a), a.shape)
