"""``gc`` of a local directory: the files that saves which never committed left there.

A rank killed mid-save leaves temp shard files (``P.data-….tmp-<token>``) and maybe published
shards and its partial index (``P.index.part-…``); a coordinator killed before its commit
leaves every rank's. No index references them, and the next commit at ``P`` removes them
(commit.rs ``cleanup``), but a prefix that is never saved again (a numbered checkpoint of a
manager) keeps them forever. This is the local twin of the object stores' ``gc``
(rust/src/store/remote_commit.rs): it removes, under every prefix of the directory,

- partial indexes (a commit consumes them; one left behind belongs to a save that died);
- shards that ``P.index`` does not reference (all of them when there is no index);
- the same files under the prefix's hashed directories ``P/HH/data-…`` and
  ``P/HH/index.part-…`` (saves with ``hashed_prefixes=True``, FORMAT.md §3.1.1), then those
  directories and ``P/`` itself when that left them empty (a directory holding anything else,
  such as a user's own file, stays);
- temp files that no live writer holds (a writer holds an exclusive ``flock`` on its temp
  files until it closes them; a killed writer's lock dies with it),

each only when last modified at least ``older_than`` seconds ago, and only while holding the
prefix's commit lock ``P.lock`` (every publish and commit at ``P`` holds it: a save that is
publishing right now is never cut). A prefix whose index cannot be read is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator

from .. import _core
from ..errors import CheckpointError

__all__ = ["gc_directory", "gc_hashed_prefix"]

#: The name marks of files a save owns besides ``P.index`` (rust/src/naming.rs).
_DATA_MARK = ".data-"
_PARTIAL_MARK = ".index.part-"
_INDEX_TEMP_MARK = ".index.tmp-"
_TEMP_MARK = ".tmp-"


#: A hashed shard name (FORMAT.md §3.1.1), optionally its temp file's ``.tmp-<16 hex>``.
_HEX2 = re.compile(r"[0-9a-f]{2}")
_HASHED = re.compile(
    r"/([0-9a-f]{2})/data-([0-9]{5}-of-[0-9]{5})(\.[0-9a-f]{16})?(\.tmp-[0-9a-f]{16})?"
)
#: A hashed partial index name (FORMAT.md §3.1.1), optionally its temp file's suffix.
_HASHED_PARTIAL = re.compile(
    r"/([0-9a-f]{2})/(index\.part-[0-9]{5}-of-[0-9]{5})(\.tmp-[0-9a-f]{16})?"
)


def _is_hashed_shard(suffix: str) -> bool:
    """Whether ``suffix`` names a file of ``P`` under its hashed directories: a hashed shard
    or partial index name whose ``HH`` is the hash of its plain name, or its temp file
    (naming.rs ``is_hashed_owned_suffix``). A user's own file under ``P/`` never matches."""
    m = _HASHED.fullmatch(suffix)
    plain = f".data-{m.group(2)}" if m else None
    if m is None:
        m = _HASHED_PARTIAL.fullmatch(suffix)
        plain = f".{m.group(2)}" if m else None
    if m is None or plain is None:
        return False
    return int(m.group(1), 16) == _core.crc32c(plain.encode()) & 0xFF


def _is_partial(suffix: str) -> bool:
    """Whether ``suffix`` is a partial index, plain or hashed (never referenced by an index:
    a commit consumes them, so one found here belongs to a save that died)."""
    return suffix.startswith(_PARTIAL_MARK) or (
        _HASHED_PARTIAL.fullmatch(suffix) is not None and _is_hashed_shard(suffix)
    )


def _remove_empty_dirs(prefix: str) -> None:
    """Remove ``P/HH/`` and then ``P/`` where the removals left them empty (``rmdir`` fails on
    a directory holding anything: a user's own file, a live writer's temp file, stays)."""
    try:
        subs = [e.path for e in os.scandir(prefix) if _HEX2.fullmatch(e.name) and e.is_dir()]
    except OSError:
        return
    for path in [*subs, prefix]:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _hashed_files(directory: str, base: str) -> Iterator[tuple[str, float]]:
    """``(suffix, mtime)`` of the files under ``directory/base/HH/`` that a save with hashed
    prefixes owns (a user's own files there are not listed)."""
    top = os.path.join(directory, base)
    with os.scandir(top) as subs:
        for sub in subs:
            if not _HEX2.fullmatch(sub.name) or not sub.is_dir(follow_symlinks=False):
                continue
            with os.scandir(sub.path) as files:
                for ent in files:
                    suffix = f"/{sub.name}/{ent.name}"
                    if _is_hashed_shard(suffix) and ent.is_file(follow_symlinks=False):
                        yield suffix, ent.stat(follow_symlinks=False).st_mtime


def _head(name: str) -> tuple[str, str] | None:
    """``(P's base name, suffix)`` of a file a save owns, else None."""
    cuts = [
        i for i in (name.find(m) for m in (_DATA_MARK, _PARTIAL_MARK, _INDEX_TEMP_MARK)) if i > 0
    ]
    if not cuts:
        return None
    i = min(cuts)
    return name[:i], name[i:]


@contextlib.contextmanager
def _flocked(path: str, create: bool) -> Iterator[bool]:
    """Hold an exclusive, non-blocking ``flock`` on ``path`` while in the block; yields
    whether it was taken (False: someone holds it, or the file is gone)."""
    try:
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _referenced(prefix: str) -> set[str] | None:
    """Shard suffixes ``prefix.index`` references (empty: no index); None: unreadable."""
    if not os.path.exists(prefix + ".index"):
        return set()
    try:
        r = _core.CheckpointReader(prefix)
    except (CheckpointError, OSError, ValueError):
        return None
    base = os.path.basename(prefix)
    return {_suffix_of(os.fspath(p), base) for p, _ in r.shard_files()}


def _suffix_of(path: str, base: str) -> str:
    """The name suffix after ``P`` of shard file ``path`` of a prefix whose last component is
    ``base``: ``/HH/data-…`` when hashed (``P/HH/data-…``), else ``.data-…``."""
    name = os.path.basename(path)
    hh_dir = os.path.dirname(path)
    hashed = f"/{os.path.basename(hh_dir)}/{name}"
    if os.path.basename(os.path.dirname(hh_dir)) == base and _is_hashed_shard(hashed):
        return hashed
    return name[len(base) :]


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def gc_directory(directory: str, older_than: float) -> int:
    """Remove what saves that never committed left in ``directory`` (module docstring);
    returns how many files were removed."""
    now = time.time()
    groups: dict[str, list[tuple[str, float]]] = {}
    with os.scandir(directory) as it:
        for ent in it:
            if ent.is_dir(follow_symlinks=False):
                hashed = list(_hashed_files(directory, ent.name))
                if hashed:
                    groups.setdefault(ent.name, []).extend(hashed)
                continue
            hs = _head(ent.name)
            if hs is None or not ent.is_file(follow_symlinks=False):
                continue
            groups.setdefault(hs[0], []).append((hs[1], ent.stat(follow_symlinks=False).st_mtime))
    removed = 0
    for base, files in sorted(groups.items()):
        old = [s for s, mtime in files if now - mtime >= older_than]
        removed += _gc_prefix(os.path.join(directory, base), old)
    return removed


def gc_hashed_prefix(prefix: str) -> int:
    """:func:`gc_directory` of one prefix's hashed directories ``P/HH/``, whatever their age:
    what a removal of ``P`` cut short between its index and its shards left there (a manager's
    sweep of checkpoints below the one just saved, which no save writes any more). Returns
    how many files were removed."""
    directory, base = os.path.split(prefix)
    try:
        files = [s for s, _ in _hashed_files(directory, base)]
    except OSError:
        return 0  # no `P/`
    return _gc_prefix(prefix, files)


def _gc_prefix(prefix: str, old: list[str]) -> int:
    """Remove the files of ``prefix`` among suffixes ``old`` that no save needs (module
    docstring), under its commit lock; returns how many."""
    if not old:
        return 0
    removed = 0
    with _flocked(prefix + ".lock", create=True) as held:
        if not held:
            return 0  # a save is publishing or committing at this prefix now
        keep = _referenced(prefix)
        if keep is None:
            return 0
        for suffix in old:
            path = prefix + suffix
            if _TEMP_MARK in suffix:
                with _flocked(path, create=False) as abandoned:
                    removed += abandoned and _unlink(path)
            elif _is_partial(suffix) or suffix not in keep:
                removed += _unlink(path)
        if any(s.startswith("/") for s in old):
            # a writer creating a temp shard in a directory removed here makes it again and
            # retries (shard/mod.rs `create_in`), as after a commit's cleanup
            _remove_empty_dirs(prefix)
    return removed
