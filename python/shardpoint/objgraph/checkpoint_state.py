"""The ``checkpoint`` state file: which checkpoints of a directory exist, newest last.

Text format (the same fields and spelling as TensorFlow's, so it reads familiar)::

    model_checkpoint_path: "ckpt-10"
    all_model_checkpoint_paths: "ckpt-8"
    all_model_checkpoint_paths: "ckpt-9"
    all_model_checkpoint_paths: "ckpt-10"
    all_model_checkpoint_timestamps: 1795310544.0915663
    ...
    last_preserved_timestamp: 1795310542.629382

Paths are relative to the directory when the checkpoint lives in it. Strings are JSON-quoted.
The file is replaced atomically (temp file, fsync, rename, fsync of the directory): a reader sees
the old state or the new one, never a torn file.
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
from dataclasses import dataclass, field

from .. import storage
from ..storage.atomic_files import create_temp, fsync_dir, try_lock_exclusive
from .errors import CheckpointStateError, StatePathConflictError
from .shared_reads import run_shared
from .storage_io import checkpoint_exists, is_url

__all__ = [
    "STATE_FILENAME",
    "CheckpointState",
    "read_checkpoint_state",
    "write_checkpoint_state",
    "update_checkpoint_state",
    "latest_checkpoint",
    "read_state_and_etag",
]

logger = logging.getLogger("shardpoint")
STATE_FILENAME = "checkpoint"
#: default of the ``etag`` arguments: the etag this process last saw of the state object
_CACHED: object = object()


@dataclass
class CheckpointState:
    """Parsed state file; paths are as stored (relative to the directory when possible)."""

    model_checkpoint_path: str
    all_model_checkpoint_paths: list[str] = field(default_factory=list)
    all_model_checkpoint_timestamps: list[float] = field(default_factory=list)
    last_preserved_timestamp: float | None = None


class _ParseError(ValueError):
    pass


def _parse(text: str) -> CheckpointState | None:
    model: str | None = None
    paths: list[str] = []
    stamps: list[float] = []
    preserved: float | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, raw = line.partition(":")
        if not sep:
            raise _ParseError(f"line {lineno}: expected 'field: value'")
        name, raw = name.strip(), raw.strip()
        try:
            if name == "model_checkpoint_path":
                model = _string(raw)
            elif name == "all_model_checkpoint_paths":
                paths.append(_string(raw))
            elif name == "all_model_checkpoint_timestamps":
                stamps.append(float(raw))
            elif name == "last_preserved_timestamp":
                preserved = float(raw)
            else:
                raise _ParseError(f"line {lineno}: unknown field {name!r}")
        except ValueError as exc:
            raise _ParseError(f"line {lineno}: {exc}") from exc
    if model is None:
        return None
    return CheckpointState(model, paths, stamps, preserved)


def _string(raw: str) -> str:
    value = json.loads(raw)
    if not isinstance(value, str):
        raise _ParseError(f"expected a quoted string, got {raw!r}")
    return value


def read_checkpoint_state(directory: str | os.PathLike) -> CheckpointState | None:
    """Parse ``<directory>/checkpoint``.

    Missing file or directory → None. Empty (or without a model path) → CheckpointStateError
    "Invalid checkpoint state loaded from <dir>" (STATE-04). Unparsable → a warning and None.
    """
    directory = os.fspath(directory)
    path = _join(directory, STATE_FILENAME)
    if is_url(directory):
        remote_text = _read_object(path)
        if remote_text is None:
            return None
        text = remote_text
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
    try:
        state = _parse(text)
    except _ParseError as exc:
        logger.warning("ParseError: %s\n%s: Checkpoint ignored", exc, path)
        return None
    if state is None:
        raise CheckpointStateError(f"Invalid checkpoint state loaded from {directory}")
    return state


def write_checkpoint_state(
    directory: str | os.PathLike, state: CheckpointState, *, etag: object = _CACHED
) -> str | None:
    """Atomically replace ``<directory>/checkpoint`` with ``state``.

    On a URL the put is conditional on ``etag`` (a string: ``If-Match``; None: the object must
    not exist yet), by default the etag this process last saw; returns the new etag (None for
    a local file)."""
    directory = os.fspath(directory)
    lines = [f"model_checkpoint_path: {json.dumps(state.model_checkpoint_path)}"]
    lines += [
        f"all_model_checkpoint_paths: {json.dumps(p)}" for p in state.all_model_checkpoint_paths
    ]
    lines += [
        f"all_model_checkpoint_timestamps: {t!r}" for t in state.all_model_checkpoint_timestamps
    ]
    if state.last_preserved_timestamp is not None:
        lines.append(f"last_preserved_timestamp: {state.last_preserved_timestamp!r}")
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if is_url(directory):
        return _write_object(_join(directory, STATE_FILENAME), data, etag)
    os.makedirs(directory or ".", exist_ok=True)
    # mode 0666 minus the umask, like the checkpoints it names (mkstemp would make it 0600)
    fd, tmp = create_temp(directory or ".", ".checkpoint.", ".tmp")
    try:
        # Locked while we write it: tells _remove_stale_temps in another process it is live
        # (where flock is unsupported that cleanup keeps every temp file instead).
        try_lock_exclusive(fd)
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, STATE_FILENAME))
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory, strict=False)
    _remove_stale_temps(directory)
    return None


def _remove_stale_temps(directory: str) -> None:
    """Unlink ``.checkpoint.*.tmp`` files left by writers killed mid-update. A live writer holds
    an exclusive flock on its temp file; a dead one's lock died with it."""
    for tmp in glob.glob(os.path.join(glob.escape(directory or "."), ".checkpoint.*.tmp")):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # in use by a live writer
        finally:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass


#: URL of a state object -> the etag this process last read or wrote (None: known absent).
_etags: dict[str, str | None] = {}


def _join(directory: str, name: str) -> str:
    if is_url(directory):
        return directory.rstrip("/") + "/" + name
    return os.path.join(directory, name)


def _read_object(url: str) -> str | None:
    from ..errors import NotFoundError

    try:
        data, etag = storage.read_object(url)
    except NotFoundError:
        _etags[url] = None
        return None
    _etags[url] = etag
    return data.decode("utf-8")


def last_seen_etag(directory: str) -> str | None:
    """The etag of ``<directory>/checkpoint`` this process last read or wrote (None: absent
    or never seen)."""
    return _etags.get(_join(directory, STATE_FILENAME))


def state_object_etag(directory: str) -> str | None:
    """Current etag of ``<directory>/checkpoint`` on an object store (None: absent); one GET."""
    url = _join(directory, STATE_FILENAME)
    _read_object(url)
    return _etags[url]


def _write_object(url: str, data: bytes, expected: object = _CACHED) -> str | None:
    """Replace the state object only if it is still the version ``expected`` (by default the
    one this process last saw: ``If-Match``), or create it only if absent
    (``If-None-Match: *``). Returns the new etag."""
    if expected is _CACHED:
        if url not in _etags:
            _read_object(url)
        etag = _etags[url]
    else:
        etag = expected  # type: ignore[assignment]  # not the _CACHED sentinel: a str or None
    if etag is None:
        new = storage.write_object(url, data, mode="create")
    else:
        new = storage.write_object(url, data, mode="update", etag=etag)
    _etags[url] = new
    return new


def _relative(directory: str, path: str) -> str:
    if is_url(directory):
        head = directory.rstrip("/") + "/"
        rest = path[len(head) :] if path.startswith(head) else None
        return rest if rest and "/" not in rest else path
    if not os.path.isabs(path) and os.path.dirname(path) == directory:
        return os.path.basename(path)
    if os.path.abspath(os.path.dirname(path)) == os.path.abspath(directory):
        return os.path.basename(path)
    return path


def update_checkpoint_state(
    directory: str | os.PathLike,
    model_checkpoint_path: str,
    all_model_checkpoint_paths: list[str] | None = None,
    all_model_checkpoint_timestamps: list[float] | None = None,
    last_preserved_timestamp: float | None = None,
    *,
    etag: object = _CACHED,
) -> None:
    """Write the state file naming ``model_checkpoint_path`` as the latest checkpoint.

    Raises StatePathConflictError when the checkpoint path is the state file itself (SAVE-09).
    ``etag``: see :func:`write_checkpoint_state` (the new etag is then :func:`last_seen_etag`).
    """
    directory = os.fspath(directory)
    state_path = _join(directory, STATE_FILENAME)
    if model_checkpoint_path == state_path or (
        not is_url(directory)
        and os.path.abspath(model_checkpoint_path) == os.path.abspath(state_path)
    ):
        raise StatePathConflictError(
            f"Save path '{model_checkpoint_path}' conflicts with path used for checkpoint state. "
            "Please use a different save path."
        )
    paths = all_model_checkpoint_paths
    if paths is None:
        paths = [model_checkpoint_path]
    state = CheckpointState(
        _relative(directory, model_checkpoint_path),
        [_relative(directory, p) for p in paths],
        list(all_model_checkpoint_timestamps or []),
        last_preserved_timestamp,
    )
    if etag is _CACHED:
        write_checkpoint_state(directory, state)
    else:
        write_checkpoint_state(directory, state, etag=etag)


def resolve(directory: str, stored: str) -> str:
    """A stored path as a usable one: joined to the directory unless absolute (STATE-02)."""
    if is_url(stored) or os.path.isabs(stored):
        return stored
    return _join(directory, stored)


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> str | None:
    """Prefix of the newest checkpoint recorded in ``checkpoint_dir``'s state file, or None.

    None when there is no state file or directory, and (with an error log) when the state file
    names a checkpoint whose index is gone (STATE-03).
    """
    directory = os.fspath(checkpoint_dir)

    def read() -> str | None:
        state = read_checkpoint_state(directory)
        if state is None:
            return None
        path = resolve(directory, state.model_checkpoint_path)
        if checkpoint_exists(path):
            return path
        logger.error("Couldn't match files for checkpoint %s", path)
        return None

    # once for every process of the job when a runner is installed (shared_reads)
    return run_shared(read)


def read_state_and_etag(directory: str) -> tuple[CheckpointState | None, str | None]:
    """:func:`read_checkpoint_state` and, for a URL, the etag it read (None for a local
    directory or an absent object), done once for the job when a shared-read runner is
    installed; the etag is remembered here too, so a later conditional update of the state
    object by this process expects the version that was read."""

    def read() -> tuple[CheckpointState | None, str | None]:
        state = read_checkpoint_state(directory)
        return state, last_seen_etag(directory) if is_url(directory) else None

    state, etag = run_shared(read)
    if is_url(directory):
        _etags[_join(directory, STATE_FILENAME)] = etag
    return state, etag
