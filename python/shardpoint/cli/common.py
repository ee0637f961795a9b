"""What every command shares: the exit statuses, the failure a command raises, and the plain-text
table and size formatting (stdout stays plain text, so output piped to other tools parses)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_OK = 0
EXIT_DAMAGED = 1  # verify found damage, a file is corrupt, or diff found differences
EXIT_USAGE = 2  # bad arguments or unsupported input (argparse uses 2 as well)
EXIT_NOT_FOUND = 3  # a checkpoint or file does not exist
EXIT_IO = 4  # the operating system refused a read or write
EXIT_NONFINITE = (
    2  # stats: a tensor holds NaN/Inf (same number as usage errors; see docs/INSPECT.md)
)
EXIT_INTERNAL = 70  # a bug in shardpoint (EX_SOFTWARE); prints a traceback


class _Fail(Exception):
    """A command's own failure: message and exit status (e.g. diff found differences)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# --- formatting ------------------------------------------------------------------------------
def human(n: int) -> str:
    """Bytes in binary units: 0 B, 1023 B, 1.5 KiB, 12.0 MiB."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{int(v)} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


#: Widest a column is padded to: a longer cell (a long key) overflows its own line only,
#: instead of padding every line of the table to its width.
_MAX_COLUMN = 120
#: Characters of a key shown in the ``ls`` table (``--json`` lists keys whole).
_MAX_KEY_SHOWN = 1000


def _table(rows: list[list[str]], right: set[int]) -> str:
    widths = [min(max(len(r[i]) for r in rows), _MAX_COLUMN) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _emit(text: str) -> None:
    sys.stdout.write(text + "\n")


def _note(text: str) -> None:
    sys.stderr.write(f"shardpoint: note: {text}\n")


def _shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
