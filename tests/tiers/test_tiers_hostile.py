"""Hostile bytes the tiers read (DESIGN.md §3): a message from a peer whose header nests
deeper than the JSON decoder's stack, holds numbers that are not integers, or lists a part's
files in an order ``write_part`` would commit wrongly (the index before a shard, a file
twice); a commit record nested too deep or listing files of the wrong shape. Each is refused
as a CorruptCheckpointError naming the sender (a message) or ignored with a warning (a record:
its copy then does not count, which is safe), never a RecursionError/OverflowError out of the
decoder."""

from __future__ import annotations

import json
import logging
import struct

import pytest

from shardpoint.errors import CorruptCheckpointError
from shardpoint.tiers.layout import read_record
from shardpoint.tiers.parts import Part, PartFile, decode_parts, encode_parts

SHARD = ".data-00000-of-00001"


def _message(header: bytes | dict, body: bytes = b"") -> bytes:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<8sQ", b"SPTIERS1", len(head)) + head + body


def _part(**changes) -> dict:
    rec = {"owner": 1, "step": 3, "token": "t", "files": [[SHARD, 2, 0], [".index", 2, 0]]}
    rec.update(changes)
    return {"parts": [rec]}


def test_a_well_formed_message_decodes() -> None:
    """The baseline of the hostile variants below."""
    (got,) = decode_parts(_message(_part(), b"abcd"), "rank 1")
    assert (got.owner, got.step, got.token) == (1, 3, "t")
    assert [(f.suffix, bytes(f.data)) for f in got.files] == [(SHARD, b"ab"), (".index", b"cd")]


@pytest.mark.parametrize(
    "head",
    [b"[" * 100_000 + b"]" * 100_000, b'{"parts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"],
)
def test_a_header_nested_past_the_stack(head: bytes) -> None:
    with pytest.raises(CorruptCheckpointError, match="message from rank 1: unreadable header"):
        decode_parts(_message(head), "rank 1")


@pytest.mark.parametrize(
    "header",
    [
        b'{"parts": [{"owner": Infinity, "step": 3, "token": "t", "files": []}]}',
        b'{"parts": [{"owner": NaN, "step": 3, "token": "t", "files": []}]}',
        json.dumps(_part(owner=1.7)).encode(),  # was truncated to rank 1
        json.dumps(_part(step=True)).encode(),
        json.dumps(_part(token=5)).encode(),
        json.dumps(_part(files=[[SHARD, 2.0, 0], [".index", 2, 0]])).encode(),
        json.dumps(_part(files=[[SHARD, "9" * 5000, 0], [".index", 2, 0]])).encode(),
    ],
)
def test_numbers_that_are_not_integers(header: bytes) -> None:
    with pytest.raises(CorruptCheckpointError, match="message from rank 1: bad part record") as e:
        decode_parts(_message(header, b"abcd"), "rank 1")
    assert len(str(e.value)) < 300  # a 5,000-digit field is not copied into the error


@pytest.mark.parametrize(
    "files",
    [
        [[".index", 1, 0], [SHARD, 1, 0], [".index", 2, 0]],  # the index before a shard
        [[SHARD, 1, 0], [SHARD, 1, 0], [".index", 2, 0]],  # a shard twice
    ],
)
def test_files_in_an_order_that_would_commit_wrongly(files: list) -> None:
    with pytest.raises(CorruptCheckpointError, match="each must appear once, the index last"):
        decode_parts(_message(_part(files=files), b"abcd"), "rank 1")


def test_encode_parts_output_still_decodes() -> None:
    part = Part(2, 5, "x", [PartFile(SHARD, b"abc", 7), PartFile(".index", b"ix", 9)])
    (got,) = decode_parts(encode_parts([part]), "rank 2")
    assert [(f.suffix, f.crc) for f in got.files] == [(SHARD, 7), (".index", 9)]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000, "maximum recursion depth"),
        ('{"step": 1, "token": "t", "files": "abc"}', "not a list of"),
        ('{"step": 1, "token": "t", "files": [["' + SHARD + '", -1, 0]]}', "not a list of"),
        ('{"step": 1, "token": "t", "files": [["' + SHARD + '", 1, 4294967296]]}', "not a list"),
        ('{"step": 1, "token": "t", "files": [[".index", 1]]}', "not a list of"),
    ],
)
def test_unreadable_commit_records_are_ignored(tmp_path, caplog, text: str, why: str) -> None:
    path = tmp_path / "ckpt-1.commit"
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="shardpoint"):
        assert read_record(str(path)) is None
    assert f"{path}: ignoring an unreadable tier commit record" in caplog.text
    assert why in caplog.text


def test_a_well_formed_commit_record_reads(tmp_path) -> None:
    path = tmp_path / "ckpt-1.commit"
    path.write_text(json.dumps({"step": 1, "token": "t", "files": [[SHARD, 3, 7]]}))
    assert read_record(str(path)) == {"step": 1, "token": "t", "files": [[SHARD, 3, 7]]}


@pytest.mark.parametrize("how", ["read_parts_message", "map_part_pieces"])
def test_a_replica_truncated_mid_value_is_refused_before_it_is_sent(tmp_path, how: str) -> None:
    """A local copy whose shard lost its tail (a crash, a full disk) is refused where it is
    read to be sent, naming the shard, its length and the index's (the index records each
    shard's length), so no peer receives it."""
    import numpy as np

    import shardpoint as sp
    from shardpoint.tiers.parts import file_list, map_part_pieces, read_parts_message

    prefix = str(tmp_path / "ckpt-1")
    sp.save_file({"w": np.arange(20_000, dtype=np.float32)}, prefix, compression="none")
    _, (part,) = read_parts_message([(prefix, 0, 1, "t", None)])
    record = file_list(part)
    (shard, length, _), _ = record
    with open(prefix + shard, "r+b") as f:
        f.truncate(length - 1000)  # inside the tensor's bytes
    spec = (prefix, 0, 1, "t", record)
    read = read_parts_message if how == "read_parts_message" else map_part_pieces
    with pytest.raises(CorruptCheckpointError) as e:
        read([spec] if how == "read_parts_message" else spec)  # type: ignore[operator]
    assert f"{prefix}{shard}" in str(e.value)
    assert f"is {length - 1000} bytes but the index records {length}" in str(e.value)
