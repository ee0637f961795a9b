"""Looking inside checkpoints: numerical health (:mod:`.health`), value differences between
two checkpoints (:mod:`.valuediff`) and a self-contained page to browse one (:mod:`.page`).

The heavy passes run in the Rust core with the GIL released; this layer picks keys, formats
results and reads any format :mod:`shardpoint.convert` reads. See docs/INSPECT.md.
"""

from __future__ import annotations

from .health import checkpoint_stats, has_nonfinite
from .valuediff import TensorChange, ValueDiff, value_diff

__all__ = ["checkpoint_stats", "has_nonfinite", "TensorChange", "ValueDiff", "value_diff"]
