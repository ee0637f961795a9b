"""The ``shardpoint`` command line (also ``python -m shardpoint``).

Every command opens checkpoints lazily and streams values, so listing or verifying a 100 GB
checkpoint costs its index (or its checksums), not its size in memory. Expected failures (missing
file, damaged file, bad arguments) print one ``shardpoint: error: ...`` line and exit with the
status documented in ``EPILOG``; only a bug in shardpoint itself prints a traceback.
"""

from __future__ import annotations

from .common import (
    EXIT_DAMAGED,
    EXIT_INTERNAL,
    EXIT_IO,
    EXIT_NONFINITE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    human,
)
from .main import main
from .parser import build_parser

__all__ = [
    "main",
    "build_parser",
    "human",
    "EXIT_OK",
    "EXIT_DAMAGED",
    "EXIT_USAGE",
    "EXIT_NOT_FOUND",
    "EXIT_IO",
    "EXIT_NONFINITE",
    "EXIT_INTERNAL",
]
