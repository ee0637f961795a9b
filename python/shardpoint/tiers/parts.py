"""A rank's checkpoint part as files: read with checksums, sent as one message, written back.

A part is an ordinary shardpoint checkpoint at a prefix ``P`` (FORMAT.md §1: shard files
``P.data-SSSSS-of-NNNNN[.<token>]``, or ``P/HH/data-…`` with hashed prefixes (§3.1.1), and
``P.index``). The index stores each shard's name
*suffix*, so the same bytes written under another prefix are the same checkpoint: that is how
a part is replicated to a peer or uploaded to the persistent tier, byte for byte, without
decoding or recompressing anything.

Every file travels with its crc32c, computed from the bytes read at the source; the receiver
checks it before a byte is written (so a replica damaged on the wire or on the peer's disk is
refused), and the index is written last, so a part is complete or absent (FORMAT.md §8).
Messages come from other processes and are hostile input: every length and name is checked.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import struct
from dataclasses import dataclass, field
from typing import Any

from .. import storage
from ..errors import ChecksumMismatchError, CorruptCheckpointError
from ..storage.atomic_files import create_temp, fsync_dir, make_dirs

__all__ = [
    "PartFile",
    "Part",
    "PartSpec",
    "read_part",
    "read_parts_message",
    "map_part_pieces",
    "write_part",
    "encode_parts",
    "decode_parts",
    "join",
    "file_list",
    "sync_part",
]

_SUFFIX = re.compile(r"\.(index|data-[0-9]{5}-of-[0-9]{5}(\.[0-9a-f]{16})?)")
#: a hashed shard name (FORMAT.md §3.1.1): ``/HH/data-…``, ``HH`` checked against the hash
_HASHED_SUFFIX = re.compile(r"/([0-9a-f]{2})/data-([0-9]{5}-of-[0-9]{5})(\.[0-9a-f]{16})?")
_MAGIC = b"SPTIERS1"
_HEAD = struct.Struct("<8sQ")
#: caps on what a message may claim before anything is allocated for it
_MAX_HEADER = 16 << 20
_MAX_FILES = 1 << 16


@dataclass
class PartFile:
    """One file of a part: its name suffix, its bytes and their crc32c."""

    suffix: str
    data: bytes | memoryview
    crc: int

    def check(self, where: str) -> None:
        got = storage.crc32c(self.data)
        if got != self.crc:
            raise ChecksumMismatchError(
                f"{where}{self.suffix}: crc32c {got:#010x} of the {len(self.data)} bytes "
                f"received differs from {self.crc:#010x} recorded at the source"
            )


@dataclass
class Part:
    """One rank's part of one step: the owner rank, the step, the save's token, its files
    (data shards first, the index last)."""

    owner: int
    step: int
    token: str
    files: list[PartFile] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(len(f.data) for f in self.files)


def join(directory: str, name: str) -> str:
    """``directory/name`` for a local path or an object-store URL."""
    if storage.is_url(directory):
        return directory.rstrip("/") + "/" + name
    return os.path.join(directory, name)


def _is_hashed(suffix: str) -> bool:
    """Whether ``suffix`` is exactly a hashed shard name (its ``HH`` the hash of its number):
    no other ``/``, no ``..`` passes, so a peer's message cannot name a file outside ``P/``."""
    m = _HASHED_SUFFIX.fullmatch(suffix)
    return m is not None and int(m.group(1), 16) == (
        storage.crc32c(f".data-{m.group(2)}".encode()) & 0xFF
    )


def _check_suffix(suffix: str, where: str) -> None:
    if not isinstance(suffix, str) or not (_SUFFIX.fullmatch(suffix) or _is_hashed(suffix)):
        raise CorruptCheckpointError(f"{where}: {suffix!r} is not a checkpoint file suffix")


def _shard_dirs(prefix: str, suffixes: list[str]) -> list[str]:
    """The directories to fsync before a local part's index is written: ``P/HH/`` of each
    hashed shard, then ``P/`` (which holds them), then ``P``'s own directory."""
    hashed = sorted({os.path.dirname(prefix + s) for s in suffixes if s.startswith("/")})
    return [*hashed, *([prefix] if hashed else []), os.path.dirname(prefix)]


def _read_whole(path: str) -> bytes:
    if storage.is_url(path):
        return bytes(storage.read_object(path)[0])
    with open(path, "rb") as f:
        return f.read()


def _suffixes(prefix: str) -> list[str]:
    """The file suffixes of the checkpoint at ``prefix``, data shards first, the index last.
    The shard list comes from the index itself (never from a directory listing, which may hold
    leftovers), and the index's own checksums are checked as it is opened."""
    with storage.open(prefix, verify=True) as r:
        shards = [os.fspath(p) for p, _ in r.format_info["shards"]]
    base = (
        prefix.rstrip("/").rsplit("/", 1)[-1]
        if storage.is_url(prefix)
        else os.path.basename(prefix)
    )
    out = []
    for path in shards:
        # a hashed shard is `P/HH/data-…`: its suffix spans two path components
        name = os.path.basename(path)
        hh = os.path.basename(os.path.dirname(path))
        if _is_hashed(f"/{hh}/{name}"):
            suffix = f"/{hh}/{name}"
        else:
            suffix = name[len(base) :] if name.startswith(base) else name
        _check_suffix(suffix, prefix)
        out.append(suffix)
    return [*out, ".index"]


def _recorded_crcs(prefix: str, suffixes: list[str], expect: list[Any]) -> dict[str, int]:
    recorded = {str(s): (int(n), int(c)) for s, n, c in expect}
    if sorted(recorded) != sorted(suffixes):
        raise CorruptCheckpointError(
            f"{prefix}: files {sorted(suffixes)} differ from the commit record's {sorted(recorded)}"
        )
    return {s: c for s, (_, c) in recorded.items()}


def read_part(
    prefix: str, owner: int, step: int, token: str, *, expect: list[Any] | None = None
) -> Part:
    """The files of the checkpoint at ``prefix`` (local or URL) with their crc32c, index last.
    ``expect``: the ``[suffix, length, crc]`` list of the copy's commit record; the files then
    carry those crcs (not ones computed from what is on disk now), so damage since the commit
    is caught by whoever checks them (:meth:`PartFile.check`). A local part is read straight
    into one message buffer (:func:`read_parts_message`), its files views of it."""
    if not storage.is_url(prefix):
        return read_parts_message([(prefix, owner, step, token, expect)])[1][0]
    suffixes = _suffixes(prefix)
    crcs = _recorded_crcs(prefix, suffixes, expect) if expect is not None else None
    part = Part(owner, step, token)
    for suffix in suffixes:
        data = _read_whole(prefix + suffix)
        crc = crcs[suffix] if crcs is not None else storage.crc32c(data)
        part.files.append(PartFile(suffix, data, crc))
    return part


#: what :func:`read_parts_message` reads: (prefix, owner, step, token, expect)
PartSpec = tuple[str, int, int, str, "list[Any] | None"]
_CRC_WIDTH = 4294967295  # the widest crc: the header's room is reserved with it


def read_parts_message(specs: list[PartSpec]) -> tuple[memoryview, list[Part]]:
    """The local parts ``specs`` name, read straight into one message (the layout of
    :func:`encode_parts`) and nothing copied again: the buffer is allocated once (not zeroed)
    with room for the header, each file is read into its place with ``readinto``, and the
    parts returned hold views of it. A file's crc is its commit record's (``expect``) or,
    without one, computed from the bytes read. A file whose size changes while it is read is
    an error naming it."""
    import numpy as np

    layout: list[tuple[PartSpec, list[tuple[str, int]], dict[str, int] | None]] = []
    for spec in specs:
        prefix, _, _, _, expect = spec
        suffixes = _suffixes(prefix)
        crcs = _recorded_crcs(prefix, suffixes, expect) if expect is not None else None
        layout.append((spec, [(s, os.stat(prefix + s).st_size) for s in suffixes], crcs))

    def header(crc_of: Any) -> bytes:
        return json.dumps(
            {
                "parts": [
                    {
                        "owner": owner,
                        "step": step,
                        "token": token,
                        "files": [[s, n, crc_of(prefix, s)] for s, n in files],
                    }
                    for (prefix, owner, step, token, _), files, _ in layout
                ]
            }
        ).encode("utf-8")

    room = len(header(lambda p, s: _CRC_WIDTH))
    total = _HEAD.size + room + sum(n for _, files, _ in layout for _, n in files)
    message = np.empty(total, dtype=np.uint8).data.cast("B")
    pos = _HEAD.size + room
    parts: list[Part] = []
    crc_at: dict[tuple[str, str], int] = {}
    for (prefix, owner, step, token, _), files, crcs in layout:
        part = Part(owner, step, token)
        for suffix, n in files:
            view = message[pos : pos + n]
            _read_into(prefix + suffix, view)
            crc = crcs[suffix] if crcs is not None else storage.crc32c(view)
            crc_at[(prefix, suffix)] = crc
            part.files.append(PartFile(suffix, view, crc))
            pos += n
        parts.append(part)
    head = header(lambda p, s: crc_at[(p, s)])
    message[: _HEAD.size] = _HEAD.pack(_MAGIC, room)
    # JSON allows trailing white space: the header is padded to its reserved room
    message[_HEAD.size : _HEAD.size + room] = head + b" " * (room - len(head))
    return message, parts


def map_part_pieces(spec: PartSpec) -> tuple[list[bytes | memoryview], Part]:
    """The message :func:`read_parts_message` would build for one local part, as pieces sent
    one after the other without copying a byte: the header, then each file mapped from the
    page cache (``mmap`` with ``MAP_POPULATE``: its pages mapped in one call, not faulted in
    one by one, and never copied into a message buffer); and the part, its files views of the
    mappings. A file's crc is its commit record's (``expect``) or, without one, computed from
    the mapped bytes. The receiver joins the pieces into one buffer
    (:meth:`Collective.exchange`), which :func:`decode_parts` reads as any message."""
    import mmap

    prefix, owner, step, token, expect = spec
    suffixes = _suffixes(prefix)
    crcs = _recorded_crcs(prefix, suffixes, expect) if expect is not None else None
    part = Part(owner, step, token)
    for suffix in suffixes:
        data: bytes | memoryview = b""
        with open(prefix + suffix, "rb", buffering=0) as f:
            n = os.fstat(f.fileno()).st_size
            if n:
                # private and writable (never written: no page is copied) so that torch can
                # view it without a warning; the mapping outlives the file object
                m = mmap.mmap(
                    f.fileno(),
                    n,
                    flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0),
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                )
                data = memoryview(m)
        crc = crcs[suffix] if crcs is not None else storage.crc32c(data)
        part.files.append(PartFile(suffix, data, crc))
    head = json.dumps(
        {"parts": [{"owner": owner, "step": step, "token": token, "files": file_list(part)}]}
    ).encode("utf-8")
    return [_HEAD.pack(_MAGIC, len(head)) + head, *(f.data for f in part.files)], part


def _read_into(path: str, view: memoryview) -> None:
    """Fill ``view`` with the whole of file ``path`` (exactly its size)."""
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise CorruptCheckpointError(
                    f"{path}: {got} bytes, shorter than the {len(view)} it had a moment ago"
                )
            got += n
        if f.read(1):
            raise CorruptCheckpointError(f"{path}: longer than the {len(view)} bytes expected")


def file_list(part: Part) -> list[list[Any]]:
    """``[suffix, length, crc]`` of each file (what a commit record keeps)."""
    return [[f.suffix, len(f.data), f.crc] for f in part.files]


def _write_local(path: str, data: bytes | memoryview, durable: bool = True) -> None:
    """Write ``path`` through a temp file: fsync (``durable``), rename, so it is whole or
    absent."""
    directory = os.path.dirname(path)
    fd, tmp = create_temp(directory, os.path.basename(path) + ".tmp-", "")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_part(part: Part, prefix: str, *, after_data: object = None, durable: bool = True) -> None:
    """Write ``part``'s files at ``prefix`` (local or URL), every crc checked first, data
    shards before the index: the part is committed when its index appears. ``after_data``
    (a callable) runs between the shards and the index (a fault point). ``durable=False``
    leaves the fsyncs to a later :func:`sync_part` (a restore reads first, syncs after)."""
    for f in part.files:
        f.check(prefix)
    if not part.files or part.files[-1].suffix != ".index":
        raise CorruptCheckpointError(f"{prefix}: a part must end with its index")
    remote = storage.is_url(prefix)
    if not remote:
        make_dirs(os.path.dirname(prefix))
    for f in part.files:
        if f.suffix == ".index":
            if callable(after_data):
                after_data()
            if not remote and durable:
                # shards durable before the commit (and the hashed directories holding them)
                for d in _shard_dirs(prefix, [g.suffix for g in part.files]):
                    fsync_dir(d)
        if remote:
            storage.write_object(prefix + f.suffix, bytes(f.data))
        else:
            if f.suffix.startswith("/"):
                make_dirs(os.path.dirname(prefix + f.suffix))  # `P/HH/` of a hashed shard
            _write_local(prefix + f.suffix, f.data, durable)
    if not remote and durable:
        fsync_dir(os.path.dirname(prefix))


def sync_part(part: Part, prefix: str) -> None:
    """fsync the files of ``part`` written at ``prefix`` with ``durable=False``, then their
    directory."""
    for f in part.files:
        fd = os.open(prefix + f.suffix, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in _shard_dirs(prefix, [f.suffix for f in part.files]):
        fsync_dir(d)


def encode_parts(parts: list[Part]) -> bytearray:
    """One message holding ``parts``: magic, header length, a JSON header (owner, step, token,
    and per file its suffix, length and crc32c), then the files' bytes in header order."""
    header = [
        {
            "owner": p.owner,
            "step": p.step,
            "token": p.token,
            "files": [[f.suffix, len(f.data), f.crc] for f in p.files],
        }
        for p in parts
    ]
    head = json.dumps({"parts": header}).encode("utf-8")
    pieces = [_HEAD.pack(_MAGIC, len(head)), head, *(f.data for p in parts for f in p.files)]
    out = bytearray(sum(len(x) for x in pieces))  # one copy, writable: sent without another
    pos = 0
    for x in pieces:
        out[pos : pos + len(x)] = x
        pos += len(x)
    return out


def decode_parts(message: bytes | memoryview, sender: str) -> list[Part]:
    """The parts of a message from ``sender`` (named in errors). Lengths are checked against
    the message before any slice, names against the checkpoint file suffixes; crcs are checked
    when the part is written (:func:`write_part`)."""
    view = memoryview(message)
    where = f"message from {sender}"
    if len(view) < _HEAD.size:
        raise CorruptCheckpointError(f"{where}: {len(view)} bytes, shorter than its header")
    magic, n = _HEAD.unpack_from(view, 0)
    if magic != _MAGIC or n > min(_MAX_HEADER, len(view) - _HEAD.size):
        raise CorruptCheckpointError(f"{where}: bad magic or header length {n}")
    try:
        header = json.loads(bytes(view[_HEAD.size : _HEAD.size + n]).decode("utf-8"))
        records = header["parts"]
        assert isinstance(records, list)
    except (ValueError, KeyError, TypeError, AssertionError, RecursionError) as e:
        # (RecursionError: arrays nested deeper than the decoder's stack)
        raise CorruptCheckpointError(f"{where}: unreadable header ({e})") from None
    pos = _HEAD.size + n
    out: list[Part] = []
    for rec in records:
        try:
            part = Part(_int(rec["owner"]), _int(rec["step"]), rec["token"])
            files = rec["files"]
            if not isinstance(part.token, str):
                raise TypeError(f"token {part.token!r} is not a string")
            if not isinstance(files, list) or len(files) > _MAX_FILES:
                raise ValueError("bad file list")
            for suffix, length, crc in files:
                _check_suffix(suffix, where)
                length, crc = _int(length), _int(crc)
                if length < 0 or length > len(view) - pos:
                    raise CorruptCheckpointError(
                        f"{where}: file {suffix!r} of {length} bytes at offset {pos} runs past "
                        f"the end of the {len(view)}-byte message"
                    )
                part.files.append(PartFile(suffix, view[pos : pos + length], crc))
                pos += length
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"{where}: bad part record ({e})") from None
        _check_order(part, where)
        out.append(part)
    if pos != len(view):
        raise CorruptCheckpointError(f"{where}: {len(view) - pos} trailing bytes at offset {pos}")
    return out


def _int(value: Any) -> int:
    """An integer of a message header: a JSON integer, nothing converted (a float would be
    truncated, an infinity overflow)."""
    if type(value) is not int:
        raise TypeError(f"{reprlib.repr(value)} is not an integer")
    return value


def _check_order(part: Part, where: str) -> None:
    """Each file once, the index last and only there: :func:`write_part` writes the files in
    order and the index commits the part, so an index before a shard (or a shard sent twice,
    the second replacing the first) would commit a part that is not the one checked."""
    suffixes = [f.suffix for f in part.files]
    if len(set(suffixes)) != len(suffixes) or ".index" in suffixes[:-1]:
        raise CorruptCheckpointError(
            f"{where}: part of rank {part.owner} lists its files {suffixes[:8]}: each must "
            "appear once, the index last"
        )
