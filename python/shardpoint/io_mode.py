"""How values are read from local files: ``io="mmap" | "pread" | "auto"``.

``mmap`` hands out zero-copy views of a private mapping: the cheapest path on a local disk
(pages are shared with the page cache, and untouched values cost nothing). On network and
user-space file systems every page fault of a mapping is a round trip to the server or the
FUSE daemon, one page at a time (safetensors #562; vLLM's ``--safetensors-load-strategy
eager`` for the same reason), so there ``pread`` reads each value with a few large parallel
reads into private memory instead. ``auto`` (the default) picks ``pread`` when the file system
holding the checkpoint is a network or FUSE one, ``mmap`` otherwise. ``load_into`` always
reads with ``pread`` (it never maps).
"""

from __future__ import annotations

import os
import re
import select

from .errors import InvalidArgumentError

__all__ = ["IO_MODES", "MOUNTINFO", "NETWORK_FS_TYPES", "fs_type", "resolve_io"]

IO_MODES = ("auto", "mmap", "pread")

#: The kernel's table of this process's mounts (``auto`` reads it; tests may pass another).
MOUNTINFO = "/proc/self/mountinfo"

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


def resolve_io(
    io: str, path: str | os.PathLike[str], *, mountinfo: str | os.PathLike[str] = MOUNTINFO
) -> str:
    """``mmap`` or ``pread`` for reading checkpoint files at ``path`` (see the module doc);
    ``mountinfo``: the mount table ``auto`` reads (default: this process's)."""
    if io not in IO_MODES:
        raise InvalidArgumentError(f"io must be one of {IO_MODES}, not {io!r}")
    if io != "auto":
        return io
    where = os.path.dirname(os.path.abspath(os.fspath(path))) or "."
    dev: int | None = None
    if os.fspath(mountinfo) == MOUNTINFO:
        if not _mounts_unchanged():
            _AUTO_BY_DEV.clear()
        try:
            dev = os.stat(where).st_dev
        except OSError:
            pass  # the open itself will say what is wrong with the path
    if dev is not None and dev in _AUTO_BY_DEV:
        return _AUTO_BY_DEV[dev]
    kind = fs_type(where, mountinfo=mountinfo)
    mode = "pread" if kind is not None and kind.split(".")[0] in NETWORK_FS_TYPES else "mmap"
    if dev is not None and kind is not None:
        _AUTO_BY_DEV[dev] = mode
    return mode
