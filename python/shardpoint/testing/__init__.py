"""Property-test your own checkpoints (docs/TESTING.md).

``shardpoint.testing`` itself needs nothing beyond numpy (no Hypothesis, no pytest):

* :func:`assert_identical` — bit-for-bit equality of tensors (numpy, torch, jax) and trees;
* :func:`assert_roundtrip` — save with shardpoint, load through a fresh reader, compare.

With ``pip install shardpoint[testing]`` (Hypothesis and pytest):

* ``shardpoint.testing.strategies`` — Hypothesis strategies for dtypes, shapes, tensors (raw
  bit patterns of every dtype, bfloat16 and float8/float4 included), keys, state dicts,
  Python objects and save options;
* ``shardpoint.testing.stateful`` — ``CheckpointManagerMachine``, a state machine that drives a
  checkpoint manager against a model;
* ``shardpoint.testing.conformance`` — ``AdapterTests`` and ``StorageTests``, pytest base
  classes for your own framework adapter or storage location.

The kit is young: names follow the contract in docs/TESTING.md, details may still change.
"""

from __future__ import annotations

from .assertions import assert_identical
from .roundtrip import assert_roundtrip

__all__ = ["assert_identical", "assert_roundtrip"]
