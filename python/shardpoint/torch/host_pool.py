"""Recycled host memory for ``weights_iterator``'s tensors.

Why: every tensor the iterator hands out is new memory (engines keep references), and on the
reference VM writing memory the process has never touched runs at 0.1-1.5 GB/s (one page fault
and one page clearing per 4 KiB; ``MAP_POPULATE`` and ``MADV_POPULATE_WRITE`` measured no
faster, docs/SERVING.md), while writing memory touched before runs at 5-7 GB/s. An engine
copies each tensor into its parameter and drops it, so the memory of the tensors it dropped is
the cheapest place for the next ones: this pool keeps each large tensor in an anonymous mapping
of its own, and when the last reference to that tensor is gone (a finalizer on the numpy array
torch's storage holds), the mapping goes back to the pool for a later tensor of the same size
class, instead of being unmapped and faulted in again.

What must stay true:
- a mapping holds one tensor at a time and is reused only after every reference to that tensor
  (views, storages, numpy arrays of it) is gone: tensors handed out are independent memory,
  and a tensor kept by its consumer is never written again (exactly ``malloc``'s contract);
- the pool's free bytes plus what the iterator has read ahead stay within the iterator's
  window (``room`` says how much is left; :meth:`trim` drops the excess), and the pool is
  emptied when the iterator closes: the memory bound stays the one documented;
- small values are not pooled (``torch.empty``: ``malloc`` recycles those itself, and a
  mapping per bias would multiply the process's mappings).
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["HUGE", "HUGE_MIN", "HostPool", "LINE", "POOL_MIN"]

#: Values at least this large get a pooled mapping of their own; smaller ones ``torch.empty``.
POOL_MIN = 1 << 20
_PAGE = 4096
#: A cache line. A value that ``pread`` copies out of the page cache is placed at its file
#: offset's place in one, so the kernel's copy (``rep movsb``) runs source and destination at
#: the same alignment: 7 GB/s on this project's VM, 2.1-5.5 GB/s with them 8-40 bytes apart (a
#: safetensors file's tensors sit wherever its header ends); a warm Hugging Face load through
#: ``weights_iterator`` spent 15 % less system time (docs/SERVING.md, "Issue 41 (ninth
#: round)"). Not for decoded values (the decoder writes them).
LINE = 64


#: A transparent huge page. Mappings for values at least :data:`HUGE_MIN` large start at a
#: huge-page boundary and ask for huge pages (``MADV_HUGEPAGE``, a hint): memory never touched
#: is faulted in a huge page at a time (first writes at 6-8 GB/s against 1.4-1.5 on small
#: pages on this project's VM), and the direct engine's reads in place need few device
#: segments (``O_DIRECT`` into huge pages 2.4-2.6 GB/s, into small pages 0.9;
#: docs/SERVING.md, "Issue 41 (tenth round)"). The kernel aligns an anonymous mapping to a
#: huge page only when its length is a multiple of one, so the pool maps one huge page more
#: (never touched) and places each value just before a boundary (:func:`_map`).
HUGE = 2 << 20
#: Values from this size get huge pages: their last huge page may be resident whole, up to
#: 2 MiB past the value's class (a quarter of a 8 MiB value at most, half of a 4 MiB one).
HUGE_MIN = 2 << 20
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)


def size_class(nbytes: int) -> int:
    """The mapping size a value of ``nbytes`` gets: rounded up to an eighth of its power of
    two (at most 12.5% unused, untouched so never resident), so that values of nearby sizes
    (a model's layers) reuse each other's mappings."""
    step = max(_PAGE, 1 << max(0, nbytes.bit_length() - 4))
    return -(-nbytes // step) * step


def _map(size: int, huge: bool) -> tuple[mmap.mmap, int]:
    """A new anonymous mapping for values of class ``size``, and where in it their page
    starts: on huge pages (see :data:`HUGE`) one small page before a huge-page boundary, so a
    value placed ``lead`` bytes into that page fills whole huge pages after it; else at 0."""
    if not huge:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), 0
    m = mmap.mmap(-1, size + HUGE + _PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if _MADV_HUGEPAGE is not None:
        try:
            m.madvise(_MADV_HUGEPAGE)
        except OSError:  # a kernel without huge pages: small pages, still correct
            pass
    addr = np.frombuffer(m, dtype=np.uint8, count=1).ctypes.data
    boundary = -(-(addr + _PAGE) // HUGE) * HUGE  # the first one a page or more past the start
    return m, boundary - _PAGE - addr


class HostPool:
    """Anonymous mappings recycled between the tensors of one iterator.

    ``room()`` is the number of bytes the pool may keep free right now (the iterator's window
    less what it has read ahead)."""

    def __init__(self, room: Callable[[], int]) -> None:
        self._room = room
        self._lock = threading.Lock()
        self._free: dict[int, list[tuple[mmap.mmap, int]]] = {}  # (mapping, start)
        self._free_bytes = 0
        self._closed = False
        self.reused = 0  # tensors placed in a recycled mapping (for tests and benches)

    @property
    def free_bytes(self) -> int:
        """Bytes of mappings kept free for later tensors."""
        return self._free_bytes

    def tensor(self, nbytes: int, lead: int = 0) -> torch.Tensor:
        """A new ``uint8`` tensor of ``nbytes`` in a mapping of its own (recycled when one of
        its size class is free), starting ``lead`` bytes into it (``0 <= lead < 4096``: the
        direct engine reads in place into a tensor placed at its file offset's page offset)."""
        if not 0 <= lead < _PAGE:
            raise ValueError(f"lead must be in [0, {_PAGE}), got {lead}")
        # one page more when the lead does not fit in the class's slack: a value that fills
        # its class exactly (a power of two: most weight matrices) keeps its class's grid
        # instead of moving up an eighth, which would keep fewer mappings within the window
        size = size_class(nbytes)
        huge = size >= HUGE_MIN and _MADV_HUGEPAGE is not None
        if huge:  # the lead sits in the small page before the first huge one (_map)
            size = -(-size // HUGE) * HUGE
        elif size < nbytes + lead:
            size += _PAGE
        got = None
        with self._lock:
            free = self._free.get(size)
            if free:
                got = free.pop()
                self._free_bytes -= size
                self.reused += 1
        if got is None:
            got = _map(size, huge)
        m, start = got
        arr = np.frombuffer(m, dtype=np.uint8, count=nbytes, offset=start + lead)
        # torch's storage holds `arr` until the last tensor or view on it is freed; then the
        # finalizer hands the mapping back (it holds `m` itself, so the mapping outlives `arr`)
        done = weakref.finalize(arr, self._give_back, got, size)
        done.atexit = False
        return torch.from_numpy(arr)

    def _give_back(self, got: tuple[mmap.mmap, int], size: int) -> None:
        with self._lock:
            if self._closed or self._free_bytes + size > self._room():
                return  # dropped: unmapped once nothing refers to it
            self._free.setdefault(size, []).append(got)
            self._free_bytes += size

    def trim(self) -> None:
        """Drop free mappings beyond ``room()`` (called after the iterator reads ahead)."""
        with self._lock:
            room = self._room()
            for size in sorted(self._free, reverse=True):
                free = self._free[size]
                while free and self._free_bytes > room:
                    free.pop()
                    self._free_bytes -= size
                if self._free_bytes <= room:
                    break

    def close(self) -> None:
        """Drop every free mapping; tensors freed later are not kept."""
        with self._lock:
            self._closed = True
            self._free.clear()
            self._free_bytes = 0
