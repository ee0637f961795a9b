"""Single-file checkpoints (FORMAT.md §10): ``save_file`` to a ``.pt``/``.sp`` name (or with
``single_file=True``) leaves exactly one file, which ``sp.open``, ``load_file``, ``verify``,
``exists``/``remove`` and the CLI (``ls``/``info``/``verify``) read; ``P.index`` means ``P``;
hostile single files (truncated, extended, forged offsets, overlapping regions, flipped bytes)
are refused with errors naming the file."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import shardpoint as sp
from shardpoint import _core
from shardpoint.cli import main as cli_main
from shardpoint.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    InvalidArgumentError,
)


def _state() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((256, 257)).astype(np.float32),  # compressed
        "b": np.arange(10, dtype=np.int64),  # small: stored raw
        "big_raw": np.arange(1 << 16, dtype=np.uint8),  # raw, page-aligned payload
        "step": 7,
        "name": "run-1",
    }


def _same(got: dict[str, object], want: dict[str, object]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got[k], v)
        else:
            assert got[k] == v


@pytest.mark.parametrize("name, flag", [("m.sp", None), ("m.pt", None), ("plain", True)])
def test_save_file_leaves_one_file_that_reads_back(tmp_path, name, flag):
    st = _state()
    p = tmp_path / name
    sp.save_file(st, p, single_file=flag, compression="zstd")
    assert os.listdir(tmp_path) == [name]  # one file, no .index, no temp left
    assert sp.exists(p)
    _same(sp.load_file(p), st)
    with sp.open(p) as r:
        assert sorted(r.keys()) == sorted(st)
        r.verify()
        assert r.info("w").codec != "none"
        # zero-copy views of raw payloads work inside the container too
        v = r["big_raw"]
        assert not v.flags["OWNDATA"]
        np.testing.assert_array_equal(v, st["big_raw"])
        fi = r.format_info
        assert [os.fspath(f) for f, _ in fi["shards"]] == [str(p)]
    sp.remove(p)
    assert os.listdir(tmp_path) == []


def test_prefix_form_unchanged_without_suffix_and_p_index_means_p(tmp_path):
    st = _state()
    p = tmp_path / "ckpt"
    sp.save_file(st, p)
    assert sorted(os.listdir(tmp_path))[0].startswith("ckpt.data-")
    assert os.path.exists(str(p) + ".index")
    _same(sp.load_file(str(p) + ".index"), st)
    with sp.open(str(p) + ".index") as r:
        assert len(r) == len(st)
    # single_file=False keeps the prefix form even for a .pt name
    sp.save_file(st, tmp_path / "x.pt", single_file=False)
    assert os.path.exists(tmp_path / "x.pt.index")


def test_replace_is_atomic_and_refusals(tmp_path):
    p = tmp_path / "m.sp"
    sp.save_file({"a": np.zeros(4, np.float32)}, p)
    sp.save_file({"a": np.ones(4, np.float32)}, p)
    np.testing.assert_array_equal(sp.load_file(p)["a"], np.ones(4, np.float32))
    # a crashed save's temp file (unlocked) is removed by the next save of the same file
    stale = tmp_path / "m.sp.tmp-0123456789abcdef"
    stale.write_bytes(b"junk")
    sp.save_file({"a": np.ones(4, np.float32)}, p)
    assert os.listdir(tmp_path) == ["m.sp"]
    with pytest.raises(InvalidArgumentError, match="incremental"):
        sp.save_file({"a": np.ones(4, np.float32)}, p, incremental=True)
    # duplicate-free, nothing written on refusal
    assert os.listdir(tmp_path) == ["m.sp"]


def _regions(b: bytes) -> tuple[int, ...]:
    return struct.unpack_from("<QQQQQ", b, 16)


def _forge(b: bytearray, **fields: int) -> bytes:
    names = ["file_len", "shard_off", "shard_len", "index_off", "index_len"]
    vals = dict(zip(names, _regions(bytes(b)), strict=True))
    vals.update(fields)
    struct.pack_into("<QQQQQ", b, 16, *(vals[n] for n in names))
    crc = _core.crc32c(bytes(b[:60]))
    struct.pack_into("<I", b, 60, crc)
    struct.pack_into("<I", b, len(b) - 8, crc)  # the trailer's copy
    return bytes(b)


def test_hostile_single_files_are_refused_naming_the_file(tmp_path):
    good_p = tmp_path / "good.sp"
    sp.save_file(_state(), good_p)
    good = good_p.read_bytes()
    file_len, shard_off, shard_len, index_off, index_len = _regions(good)
    assert (file_len, shard_off) == (len(good), 4096)
    cases = {
        "truncated": good[:-1],
        "truncated_to_header": good[:100],
        "extended": good + b"\0" * 64,
        "bad_magic": b"X" + good[1:],
        "header_crc": good[:20] + bytes([good[20] ^ 1]) + good[21:],
        "index_overlaps_shard": _forge(bytearray(good), index_off=index_off - 64),
        "shard_past_index": _forge(bytearray(good), shard_len=shard_len + 4096),
        "shard_off_zero": _forge(bytearray(good), shard_off=0),
        "index_unaligned": _forge(bytearray(good), index_off=index_off + 1),
        "index_len_huge": _forge(bytearray(good), index_len=(1 << 64) - 8),
        "index_off_overflow": _forge(bytearray(good), index_off=(1 << 64) - 64),
        "shard_short": _forge(bytearray(good), shard_len=shard_len - 64),
        "index_byte": good[: index_off + 200]
        + bytes([good[index_off + 200] ^ 1])
        + good[index_off + 201 :],
    }
    for name, data in cases.items():
        p = tmp_path / f"{name}.sp"
        p.write_bytes(data)
        with pytest.raises((CorruptCheckpointError, ChecksumMismatchError)) as ei:
            with sp.open(p) as r:
                r.verify()
        assert str(p) in str(ei.value), (name, str(ei.value))
    # a flipped payload byte: opens (open is O(1)), fails verify and the load of that key
    flip = bytearray(good)
    flip[shard_off + 4096 + 10] ^= 1
    p = tmp_path / "payload.sp"
    p.write_bytes(bytes(flip))
    with sp.open(p) as r:
        with pytest.raises(ChecksumMismatchError, match="payload.sp"):
            r.verify()
    with pytest.raises(ChecksumMismatchError):
        sp.load_file(p)


def test_cli_reads_single_files(tmp_path, capsys):
    p = tmp_path / "m.pt"
    sp.save_file(_state(), p)
    assert cli_main(["ls", str(p)]) == 0
    assert "big_raw" in capsys.readouterr().out
    assert cli_main(["info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "entries:        5" in out and str(p) in out
    assert cli_main(["verify", str(p)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {p}")
    bad = bytearray(p.read_bytes())
    bad[4096 + 4096 + 3] ^= 1
    q = tmp_path / "bad.pt"
    q.write_bytes(bytes(bad))
    assert cli_main(["verify", str(q)]) != 0
