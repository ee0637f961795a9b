"""numpy arrays to ``jax.Array``: the converter of ``sp.open(prefix, framework="jax")``
(declared in ``shardpoint/__init__``, imported on first use; bfloat16/float8 go through their
``ml_dtypes`` types, which jax shares)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["to_jax"]


def to_jax(array: np.ndarray) -> Any:
    """A ``jax.Array`` on the default device holding ``array``'s values (a copy: jax arrays
    own their buffers)."""
    import jax.numpy as jnp  # the caller asked for jax: its absence is an ImportError

    return jnp.asarray(array)
