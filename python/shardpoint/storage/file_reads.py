"""Reading a byte range of a file held open, with ``pread``, never through a mapping.

Why not a mapping: a file another program cuts while a copy out of a mapping runs kills the
process with SIGBUS, whatever size check came before the copy; ``pread`` returns short instead,
and the caller names the file and key. Used by the conversion sources (safetensors files,
TensorFlow checkpoints), which read foreign files value by value.
"""

from __future__ import annotations

import os

__all__ = ["pread_into"]


def pread_into(fd: int, out: memoryview, offset: int) -> int:
    """Fill ``out`` with the bytes of ``fd`` from ``offset``; the count read, which is less
    than ``len(out)`` only where the file ends first (one call reads at most 2 GiB on Linux:
    the loop goes on until full or end of file)."""
    done = 0
    while done < len(out):
        got = os.preadv(fd, [out[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done
