"""Delta checkpoints and weight-sync deltas: values stored against a base (docs/DELTA.md).

- ``sp.save_file(tree, P, base=B, delta=True)`` writes a checkpoint whose tensors are stored as
  the same bytes as ``B``'s, as the XOR of their bits with ``B``'s, or whole, whichever is
  smallest (:func:`save_delta`); ``sp.open``/``sp.load_file`` read it back through ``B``
  (:class:`DeltaReader`), lazily per key, each rebuilt value checked against its crc32c.
- :func:`encode` / :func:`apply`: the change between two state dicts as bytes or a file, applied
  in place to a receiver's arrays or tensors (an inference worker's weights), with the same
  checks (:mod:`.sync`).
- :func:`to_full`: a delta checkpoint exported back to a checkpoint that needs no base.

The format is FORMAT.md §11: ordinary entries plus a ``"shardpoint.delta"`` metadata section.
"""

from __future__ import annotations

from .reader import DeltaReader, as_delta_reader
from .sync import apply, encode, state_digest
from .table import DeltaEntry, DeltaTable
from .tools import describe, needed_bases, to_full
from .writer import DEFAULT_MAX_CHAIN, index_digest, save_delta

__all__ = [
    "save_delta",
    "DeltaReader",
    "as_delta_reader",
    "encode",
    "apply",
    "state_digest",
    "to_full",
    "describe",
    "needed_bases",
    "index_digest",
    "DeltaTable",
    "DeltaEntry",
    "DEFAULT_MAX_CHAIN",
]
