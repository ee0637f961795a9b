"""Where the tiers keep their copies, and the commit records that make a copy count.

Local tier (one directory per node, ``local_directory``; each rank owns one subtree of it)::

    <local>/rank-RRRRR/own/ckpt-<step>.*                 this rank's part (a checkpoint)
    <local>/rank-RRRRR/replica-OOOOO/ckpt-<step>.*       a replica of rank OOOOO's part
    <local>/rank-RRRRR/.../ckpt-<step>.tier-commit.json  its commit record

Persistent tier (``directory``: a local path or an object-store URL)::

    <directory>/ckpt-<step>/part-RRRRR.*                 rank RRRRR's part
    <directory>/ckpt-<step>/tier-commit.json             the step's commit record

A copy counts only once its commit record exists, and the record is written only after every
rank reported its part (and, in the local tier, every replica) durable: a record names the
step, the save's token (the same on every rank for one save, different for a later save of
the same step number) and the crc32c of every file. Records are removed before the files they
describe, so a crash in a deletion never leaves a record without its part.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from .. import storage
from ..errors import CheckpointError, NotFoundError
from .parts import _write_local, fsync_dir, join

__all__ = [
    "COMMIT_SUFFIX",
    "own_dir",
    "replica_dir",
    "part_prefix",
    "persistent_step_dir",
    "persistent_part",
    "write_record",
    "read_record",
    "remove_copy",
    "committed_copies",
    "persistent_steps",
]

logger = logging.getLogger("shardpoint")

COMMIT_SUFFIX = ".tier-commit.json"
PERSISTENT_RECORD = "tier-commit.json"
_STEP = re.compile(r"ckpt-([0-9]{1,18})")
_REPLICA = re.compile(r"replica-([0-9]{5})")


def own_dir(local: str, rank: int) -> str:
    return os.path.join(local, f"rank-{rank:05d}", "own")


def replica_dir(local: str, holder: int, owner: int) -> str:
    return os.path.join(local, f"rank-{holder:05d}", f"replica-{owner:05d}")


def part_prefix(directory: str, step: int) -> str:
    return os.path.join(directory, f"ckpt-{step}")


def persistent_step_dir(directory: str, step: int) -> str:
    return join(directory, f"ckpt-{step}")


def persistent_part(directory: str, step: int, owner: int) -> str:
    return join(persistent_step_dir(directory, step), f"part-{owner:05d}")


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write a commit record atomically (temp, fsync, rename, directory fsync; one PUT on an
    object store, which is atomic there)."""
    data = json.dumps(record, sort_keys=True).encode("utf-8")
    if storage.is_url(path):
        storage.write_object(path, data)
        return
    _write_local(path, data)
    fsync_dir(os.path.dirname(path))


def read_record(path: str) -> dict[str, Any] | None:
    """A commit record, or None when absent or unreadable (logged: a damaged record makes its
    copy not count, which is always safe)."""
    try:
        if storage.is_url(path):
            raw = bytes(storage.read_object(path)[0])
        else:
            with open(path, "rb") as f:
                raw = f.read(1 << 20)
        record = json.loads(raw.decode("utf-8"))
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        step, token = record.get("step"), record.get("token")
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(token, str):
            raise ValueError(f"step {step!r} and token {token!r} are not an integer and a string")
        _check_files(record.get("files"))
        return record
    except (FileNotFoundError, NotFoundError):  # absent: a local file or an object
        return None
    # (RecursionError: JSON nested deeper than the decoder's stack)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, CheckpointError) as e:
        logger.warning("%s: ignoring an unreadable tier commit record (%s)", path, e)
        return None


def _check_files(files: Any) -> None:
    """A record's ``files`` (absent, or ``[[suffix, length, crc32c], ...]``): the restore and
    the peers read crcs and lengths from it, so a record that lists anything else is
    unreadable (ValueError), never a TypeError later."""
    if files is None:
        return
    ok = isinstance(files, list) and all(
        isinstance(f, list)
        and len(f) == 3
        and isinstance(f[0], str)
        and all(type(x) is int and 0 <= x < 2**63 for x in f[1:])
        and f[2] <= 0xFFFFFFFF
        for f in files
    )
    if not ok:
        raise ValueError("its files are not a list of [suffix, length, crc32c]")


def remove_copy(prefix: str) -> None:
    """Remove a local copy: its commit record first, then the checkpoint (index first)."""
    try:
        os.unlink(prefix + COMMIT_SUFFIX)
    except FileNotFoundError:
        pass
    try:
        storage.remove(prefix)
    except (FileNotFoundError, CheckpointError):
        pass


def _steps_in(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = set()
    for name in names:
        m = _STEP.match(name)
        if m and name[m.end() :] in (".index", COMMIT_SUFFIX):
            out.add(int(m.group(1)))
    return sorted(out)


def committed_copies(local: str, rank: int) -> list[dict[str, Any]]:
    """The committed copies this rank holds: ``{"owner", "step", "token", "prefix"}`` for its
    own part and each replica whose record and index are both there."""
    out: list[dict[str, Any]] = []
    root = os.path.join(local, f"rank-{rank:05d}")
    dirs = [(rank, own_dir(local, rank))]
    try:
        for name in sorted(os.listdir(root)):
            m = _REPLICA.fullmatch(name)
            if m:
                dirs.append((int(m.group(1)), os.path.join(root, name)))
    except OSError:
        pass
    for owner, d in dirs:
        for step in _steps_in(d):
            prefix = part_prefix(d, step)
            record = read_record(prefix + COMMIT_SUFFIX)
            if record is None or int(record["step"]) != step:
                continue
            if int(record.get("owner", -1)) != owner or not storage.exists(prefix):
                continue
            out.append(
                {"owner": owner, "step": step, "token": str(record["token"]), "prefix": prefix}
            )
    return out


def local_steps(local: str, rank: int) -> dict[str, list[int]]:
    """Every step with any file (committed or not) in each directory of this rank's subtree."""
    root = os.path.join(local, f"rank-{rank:05d}")
    out: dict[str, list[int]] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        d = os.path.join(root, name)
        if os.path.isdir(d):
            out[d] = _steps_in(d)
    return out


def persistent_steps(directory: str) -> list[dict[str, Any]]:
    """Committed steps of the persistent tier: their records (``step``, ``token``, ``world``),
    newest first."""
    try:
        if storage.is_url(directory):
            names = [n.rstrip("/") for n in storage.list_url(directory) if n.endswith("/")]
        else:
            names = os.listdir(directory)
    except (OSError, CheckpointError) as e:
        logger.warning("%s: could not list the persistent tier (%s)", directory, e)
        return []
    out = []
    for name in names:
        m = _STEP.fullmatch(name)
        if not m:
            continue
        record = read_record(join(join(directory, name), PERSISTENT_RECORD))
        if record is not None and int(record["step"]) == int(m.group(1)):
            out.append(record)
    return sorted(out, key=lambda r: -int(r["step"]))
