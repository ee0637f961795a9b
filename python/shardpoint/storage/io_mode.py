"""How values are read from local files: ``io="mmap" | "pread" | "auto"``.

``mmap`` hands out zero-copy views of a private mapping: the cheapest path on a local disk
(pages are shared with the page cache, and untouched values cost nothing). On network and
user-space file systems every page fault of a mapping is a round trip to the server or the
FUSE daemon, one page at a time (safetensors #562; vLLM's ``--safetensors-load-strategy
eager`` for the same reason), so there ``pread`` reads each value with a few large parallel
reads into private memory instead. ``auto`` (the default) picks ``pread`` when the file system
holding the checkpoint is a network or FUSE one, ``mmap`` otherwise; on a network or FUSE one
whose client keeps the files' pages cached (an NFS client, ``sshfs -o kernel_cache``), files
that are already wholly in the page cache are mapped after all: there a mapping costs no
round trip, and ``pread`` would only add a copy into fresh memory (docs/TORCH.md "Loading
fast" has the figures). ``load_into`` always reads with ``pread`` (it never maps).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import re
import select
import threading
from collections.abc import Iterable

from ..errors import InvalidArgumentError

__all__ = [
    "CACHED_ENOUGH",
    "IO_MODES",
    "MOUNTINFO",
    "NETWORK_FS_TYPES",
    "cached_fraction",
    "check_io",
    "fs_type",
    "resolve_io",
]

IO_MODES = ("auto", "mmap", "pread")

#: The kernel's table of this process's mounts (``auto`` reads it; tests may pass another).
MOUNTINFO = "/proc/self/mountinfo"

#: ``auto`` maps files on a network file system when at least this fraction of their pages
#: is cached: the few faults left cost less than copying every byte into fresh memory.
CACHED_ENOUGH = 0.95

# Mount types (as /proc/self/mountinfo names them) whose page faults are remote round trips.
NETWORK_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "lustre",
        "gpfs",
        "ceph",
        "glusterfs",
        "beegfs",
        "afs",
        "virtiofs",
        "fuse",
    }
)


# Mount points escape space, tab, newline and backslash as 3-digit octal (\040).
_OCTAL = re.compile(rb"\\([0-7]{3})")


def _unescape(field: bytes) -> str:
    """A mountinfo path field as a str comparable with os.path.realpath's (bytes unescaped,
    then decoded as the OS decodes file names; no codec module is looked up lazily, which an
    unprivileged process may be unable to import)."""
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field))


def fs_type(
    path: str | os.PathLike[str], *, mountinfo: str | os.PathLike[str] = MOUNTINFO
) -> str | None:
    """The type of the file system holding ``path`` (``ext4``, ``nfs4``, ``fuse.s3fs`` ...),
    from the mount whose mount point is the longest prefix of its real path; ``None`` when
    unknown (no readable ``mountinfo``, by default ``/proc/self/mountinfo``)."""
    real = os.path.realpath(os.fspath(path))
    best, best_type = "", None
    try:
        with open(mountinfo, "rb") as f:
            for line in f:
                left, sep, right = line.partition(b" - ")
                fields = left.split()
                if not sep or len(fields) < 5 or not right.split():
                    continue
                point = _unescape(fields[4])
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, best_type = point, os.fsdecode(right.split()[0])
    except OSError:
        return None
    return best_type


# st_dev -> the mode "auto" picked for that file system (this process's mount table only).
# Parsing mountinfo costs ~50-100 µs, more than opening a checkpoint (~25 µs). A device number
# names one mounted file system while it stays mounted, but numbers are reused after an unmount,
# so the cache is dropped whenever the mount table changes: the kernel flags a change to
# readers polling /proc/self/mountinfo (POLLPRI), a ~1 µs check per call.
_AUTO_BY_DEV: dict[int, str] = {}
_watch: tuple[int, int, select.poll] | None = None  # (pid, fd, poller) of the mount watch
# A poll object refuses concurrent poll() calls (RuntimeError), and one thread's poll consumes
# the change it reports: the check and the cache clear it leads to happen under this lock.
_watch_lock = threading.Lock()


def _new_lock_in_child() -> None:
    # A lock another thread held at a fork stays held in the child (ARCHITECTURE.md, "Threads
    # and fork"); the watch itself is renewed by the pid check in _mounts_unchanged.
    global _watch_lock
    _watch_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def _mounts_unchanged() -> bool:
    """Whether the mount table is known unchanged since the last call (False the first time
    in a process, and whenever it cannot be watched)."""
    global _watch
    pid = os.getpid()
    if _watch is not None and _watch[0] == pid:
        return not _watch[2].poll(0)
    if _watch is not None:  # a forked child: the parent's watch shares its event with it
        try:
            os.close(_watch[1])
        except OSError:
            pass
        _watch = None
    try:
        fd = os.open(MOUNTINFO, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLPRI | select.POLLERR)
    poller.poll(0)  # consume the "changed" state a fresh reader starts with
    _watch = (pid, fd, poller)
    return False


def check_io(io: str) -> None:
    """Raise :class:`InvalidArgumentError` unless ``io`` is one of :data:`IO_MODES`."""
    if io not in IO_MODES:
        raise InvalidArgumentError(f"io must be one of {IO_MODES}, not {io!r}")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


def cached_fraction(path: str | os.PathLike[str]) -> float:
    """The fraction of ``path``'s pages that sit in this machine's page cache (``mincore`` on
    a mapping that is never touched, so nothing is read; files over 1024 pages are sampled in
    64 evenly spaced windows of 16 pages, so a large file costs microseconds, not a walk of
    its whole cache); 0.0 when it cannot be told."""
    libc = _libc()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return 0.0
    try:
        size = os.fstat(fd).st_size
        if libc is None or size == 0:
            return 0.0
        page = mmap.PAGESIZE
        pages = (size + page - 1) // page
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0.0
        try:
            win = pages if pages <= 1024 else 16
            starts = [0] if win == pages else [i * (pages - win) // 63 for i in range(64)]
            vec = (ctypes.c_ubyte * win)()
            resident = 0
            for first in starts:
                if libc.mincore(addr + first * page, win * page, vec) != 0:
                    return 0.0
                # bit 0 of each byte: resident; the other bits are reserved (zero)
                resident += win - bytes(vec).count(0)
            return resident / (win * len(starts))
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def resolve_io(
    io: str,
    path: str | os.PathLike[str],
    *,
    files: Iterable[str | os.PathLike[str]] = (),
    mountinfo: str | os.PathLike[str] = MOUNTINFO,
) -> str:
    """``mmap`` or ``pread`` for reading checkpoint files at ``path`` (see the module doc).

    ``files``: the data files the reads will touch; on a network or FUSE file system ``auto``
    maps them when every one is (almost) wholly in the page cache already. ``mountinfo``: the
    mount table ``auto`` reads (default: this process's)."""
    check_io(io)
    if io != "auto":
        return io
    where = os.path.dirname(os.path.abspath(os.fspath(path))) or "."
    dev: int | None = None
    if os.fspath(mountinfo) == MOUNTINFO:
        with _watch_lock:
            if not _mounts_unchanged():
                _AUTO_BY_DEV.clear()
        try:
            dev = os.stat(where).st_dev
        except OSError:
            pass  # the open itself will say what is wrong with the path
    if dev is not None and dev in _AUTO_BY_DEV:
        mode = _AUTO_BY_DEV[dev]
    else:
        kind = fs_type(where, mountinfo=mountinfo)
        mode = "pread" if kind is not None and kind.split(".")[0] in NETWORK_FS_TYPES else "mmap"
        if dev is not None and kind is not None:
            _AUTO_BY_DEV[dev] = mode
    # the file system's answer is cached; the page cache's is asked each time
    files = list(files)
    if mode == "pread" and files and all(cached_fraction(f) >= CACHED_ENOUGH for f in files):
        return "mmap"
    return mode
