"""Issue 23 item 4: ``verify()`` checks that the padding of a checkpoint is zero (FORMAT.md §2:
the shard header's padding up to ``DATA_START``, the alignment gaps between payloads; §3: any
space between index sections), so that every byte of every file is either covered by a crc,
checked field by field, or checked to be zero. A non-zero padding byte fails ``verify`` (and
``shardpoint verify``, exit 1) with an error naming the file and the byte's offset; reads,
which never look at padding, still return the saved values.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers import craft
from shardpoint.cli import main


def _saved(tmp_path) -> tuple[str, str, dict[str, np.ndarray]]:
    p = str(tmp_path / "ck")
    vals = {
        "a": np.arange(10, dtype=np.float32),  # 40 bytes at 4096: a gap up to 4160
        "b": np.arange(7, dtype=np.int8),
        "c": np.arange(300, dtype=np.float64),
    }
    sp.save_file(vals, p, compression="none")
    with sp.open(p) as r:
        (shard, _), *_ = r.format_info["shards"]
    return p, shard, vals


def _gaps(p: str, shard: str) -> list[int]:
    """A few padding offsets: after the header, before the first payload, between payloads,
    after the last payload when the file goes on."""
    with sp.open(p) as r:
        spans = sorted((r.info(k).offset, r.info(k).offset + r.info(k).stored_bytes) for k in r)
    out = [64, 1000, spans[0][0] - 1]
    for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False):
        if nxt > end:
            out += [end, nxt - 1]
    return out


def _poke(path: str, at: int, byte: int) -> int:
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte]))
    return old


def test_nonzero_padding_in_a_shard_fails_verify(tmp_path, capsys):
    p, shard, vals = _saved(tmp_path)
    positions = _gaps(p, shard)
    assert len(positions) >= 5, positions
    for at in positions:
        assert _poke(shard, at, 0x5A) == 0, f"padding at {at} was not zero as written"
        with sp.open(p) as r:
            for k, v in vals.items():  # reads never touch padding
                np.testing.assert_array_equal(r[k], v)
            with pytest.raises(sp.CorruptCheckpointError) as e:
                r.verify()
        msg = str(e.value)
        assert os.path.basename(shard) in msg and f"offset {at}" in msg, msg
        assert main(["verify", p]) == 1
        assert f"offset {at}" in capsys.readouterr().err
        _poke(shard, at, 0)
        with sp.open(p) as r:
            r.verify()


def test_nonzero_byte_between_index_sections_fails_verify(tmp_path):
    """A crafted index with 4 bytes of space before its metadata (padding: less than the 8
    bytes open refuses as unexplained): zeros verify, a non-zero byte there is named by file
    and offset (all crcs right, so nothing else can tell)."""
    p = str(tmp_path / "ck")
    es = [craft.raw_entry(b"a", "float32", [4], np.arange(4, dtype=np.float32).tobytes())]
    shards = [craft.CShard()]
    craft.write_shards(p, es, shards)
    b = bytearray(craft.build_index(es, shards))
    meta_off, meta_len = struct.unpack_from("<QQ", b, 96)
    for byte in (0, 0x01):
        gap = bytearray(4)
        gap[3] = byte
        grown = b[:meta_off] + gap + b[meta_off:]
        craft.set_header(grown, {"meta_off": meta_off + 4, "file_len": len(grown)})
        with open(p + ".index", "wb") as f:
            f.write(grown)
        with sp.open(p) as r:
            np.testing.assert_array_equal(r["a"], np.arange(4, dtype=np.float32))
            if byte == 0:
                r.verify()
                continue
            with pytest.raises(
                sp.CorruptCheckpointError, match=rf"ck\.index.*offset {meta_off + 3}"
            ):
                r.verify()
