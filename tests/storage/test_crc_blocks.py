"""Crc blocks of uncompressed values (FORMAT.md §3.4): a checked row slice reads and checks
only the blocks holding its rows; a flipped byte in one is found by the slices that read it
(naming key and block) and by ``verify``; the reference reader reads and checks the tables;
hostile tables (forged block size, a table on a compressed value, a table cut short) are
refused naming the key."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import shardpoint as sp
from reference_reader import FormatError, crc32c, read_checkpoint
from reliability_helpers import craft

BLOCK = 16 << 10  # the writer's block size (FORMAT.md §3.4)
ROWS, COLS = 1000, 100  # float32: 400 B a row, 400,000 B a value: 25 blocks


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    a = np.random.default_rng(7).standard_normal((ROWS, COLS)).astype(np.float32)
    p = str(tmp_path_factory.mktemp("blocks") / "ck")
    sp.save_file({"a": a, "small": a[:3], "zipped": np.zeros(20000)}, p, compression="none")
    return p, a


def _flip(prefix: str, offset: int) -> None:
    shard = prefix + ".data-00000-of-00001"
    with open(shard, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def test_uncompressed_values_get_blocks_and_slices_are_exact(saved: tuple) -> None:
    p, a = saved
    with sp.open(p) as r:
        assert r.info("a").codec == "none" and r.info("a").crc_blocks == 25
        assert r.info("small").crc_blocks == 0  # one block: read whole anyway
        for lo, hi in [(0, ROWS), (3, 7), (40, 41), (41, 82), (0, 41), (959, ROWS), (999, ROWS)]:
            assert np.array_equal(r.slice("a", lo, hi), a[lo:hi]), (lo, hi)
        got = r.slice_many([("a", 5, 500), ("small", 1, 2), ("a", 500, 501)])
        assert [g.shape for g in got] == [(495, COLS), (1, COLS), (1, COLS)]
        assert np.array_equal(np.concatenate([got[0], got[2]]), a[5:501])
        assert np.array_equal(got[1], a[1:2])
        np.testing.assert_array_equal(r["a"], a)
        r.verify()
    ref = read_checkpoint(p)
    assert np.array_equal(ref.values["a"], a)
    e = ref.entries["a"]
    assert e.block_log2 == 14 and len(e.block_crcs) == 25
    raw = a.tobytes()
    assert e.block_crcs == [crc32c(raw[k : k + BLOCK]) for k in range(0, len(raw), BLOCK)]


def test_a_flipped_byte_is_found_by_the_slices_that_read_its_block(tmp_path, saved) -> None:
    src, a = saved
    p = str(tmp_path / "ck")
    for suffix in (".index", ".data-00000-of-00001"):
        with open(src + suffix, "rb") as f, open(p + suffix, "wb") as g:
            g.write(f.read())
    with sp.open(p) as r:
        off = r.info("a").offset
    _flip(p, off + 3 * BLOCK + 5)  # inside block 3: raw bytes [49152, 65536), rows 122..163
    with sp.open(p) as r:
        assert np.array_equal(r.slice("a", 0, 120), a[:120])  # blocks 0..2: not read
        assert np.array_equal(r.slice("a", 164, ROWS), a[164:])  # blocks 4..: not read
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "a" crc block 3'):
            r.slice("a", 150, 151)
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "a" crc block 3'):
            r.slice_many([("a", 0, 10), ("a", 100, 200)])
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "a"'):
            r.verify()
        s = r.get_slice("a")  # the lazy slices read by runs, checking the blocks they read
        assert np.array_equal(s[0:120, 5:90:7], a[0:120, 5:90:7])
        assert np.array_equal(s[-1:-300:-2, -1], a[-1:-300:-2, -1])  # blocks 4..: not read
        with pytest.raises(sp.ChecksumMismatchError, match=r'key "a" crc block 3'):
            s[150, 3]
    with sp.open(p, verify=False) as r:
        assert r.slice("a", 150, 151).shape == (1, COLS)  # unchecked, as asked
        assert r.get_slice("a")[150:151].shape == (1, COLS)
    with pytest.raises(FormatError, match="crc block 3"):
        read_checkpoint(p)


def test_a_value_without_blocks_checks_the_bytes_it_returns(tmp_path, saved) -> None:
    """A value of one block or less has only its whole crc: a checked slice of it is checked
    against that crc over the bytes around the slice and the slice itself, so damage outside
    the rows asked for is still found, and good rows come back exact."""
    src, a = saved
    p = str(tmp_path / "ck")
    for suffix in (".index", ".data-00000-of-00001"):
        with open(src + suffix, "rb") as f, open(p + suffix, "wb") as g:
            g.write(f.read())
    with sp.open(p) as r:
        assert r.info("small").crc_blocks == 0
        assert [g.tobytes() for g in r.slice_many([("small", 0, 1), ("small", 1, 3)])] == [
            a[0:1].tobytes(),
            a[1:3].tobytes(),
        ]
        off = r.info("small").offset
    _flip(p, off + 2 * COLS * 4 + 9)  # inside row 2
    with sp.open(p) as r:
        for lo, hi in ((0, 1), (2, 3), (0, 3)):
            with pytest.raises(sp.ChecksumMismatchError, match=r'key "small"'):
                r.slice_many([("small", lo, hi)])
    _flip(p, off + 2 * COLS * 4 + 9)  # back as it was
    with sp.open(p) as r:
        assert np.array_equal(r.slice_many([("small", 1, 2)])[0], a[1:2])


def _blocked(key: bytes, raw: bytes, log2: int = 14, **kw: object) -> craft.CEntry:
    crcs = [crc32c(raw[k : k + (1 << log2)]) for k in range(0, len(raw), 1 << log2)]
    e = craft.raw_entry(key, "uint8", [len(raw)], raw)
    e.reserved = bytes([log2, 0])
    e.block_crcs = crcs
    for k, v in kw.items():
        setattr(e, k, v)
    return e


RAW = bytes(range(256)) * 200  # 51,200 bytes: 4 blocks of 16 KiB (the last short)


def test_crafted_table_is_read(tmp_path) -> None:
    p = str(tmp_path / "ok")
    craft.write_checkpoint(p, [_blocked(b"v", RAW)])
    with sp.open(p) as r:
        assert r.info("v").crc_blocks == 4
        assert bytes(r.slice("v", 20000, 40000)) == RAW[20000:40000]
        r.verify()


@pytest.mark.parametrize(
    ("name", "entry", "match"),
    [
        (
            "block size too large",
            lambda: _blocked(b"v", RAW, reserved=b"\x1e\0"),
            "crc_block_log2 30",
        ),
        (
            "block size too small",
            lambda: _blocked(b"v", RAW, reserved=b"\x0b\0"),
            "crc_block_log2 11",
        ),
        # 4 KiB blocks would need 13 crcs: the 4 stored do not fit the aux range
        ("count forged", lambda: _blocked(b"v", RAW, reserved=b"\x0c\0"), "outside its block"),
        ("table cut short", lambda: _blocked(b"v", RAW, block_crcs=[0, 0]), "outside its block"),
        ("other reserved byte", lambda: _blocked(b"v", RAW, reserved=b"\x0e\x01"), "reserved"),
    ],
)
def test_hostile_tables_are_refused_naming_the_key(tmp_path, name, entry, match) -> None:
    p = str(tmp_path / "bad")
    craft.write_checkpoint(p, [entry()])
    with pytest.raises(sp.CorruptCheckpointError, match=match) as err, sp.open(p) as r:
        r.slice("v", 0, 10)
    assert '"v"' in str(err.value) or "'v'" in str(err.value), (name, err.value)


def test_a_table_on_a_compressed_value_is_refused(tmp_path) -> None:
    raw = bytes(8192)
    e = craft.chunk_entry(b"z", "uint8", [len(raw)], raw, chunk_bytes=4096)
    e.reserved = b"\x0e\0"
    e.block_crcs = [crc32c(raw)]
    p = str(tmp_path / "z")
    craft.write_checkpoint(p, [e], chunk_bytes=4096)
    with pytest.raises(sp.CorruptCheckpointError, match="crc_block_log2 14 on a zstd value"):
        with sp.open(p) as r:
            r["z"]


def test_a_table_that_disagrees_with_the_data_fails_verify(tmp_path) -> None:
    """Crcs consistent with the index but not with the bytes: the whole-value crc still
    matches, so only the block check can tell; slices and verify both refuse."""
    p = str(tmp_path / "lie")
    e = _blocked(b"v", RAW)
    assert e.block_crcs is not None
    e.block_crcs[1] ^= 1
    craft.write_checkpoint(p, [e])
    with sp.open(p) as r:
        assert bytes(r["v"]) == RAW  # whole reads check the whole-value crc
        with pytest.raises(sp.ChecksumMismatchError, match="crc block 1"):
            r.slice("v", 17000, 17001)
        with pytest.raises(sp.ChecksumMismatchError, match="crc block 1"):
            r.verify()


def test_index_cost_is_four_bytes_per_block(tmp_path) -> None:
    a = np.zeros((1 << 20,), dtype=np.uint8)
    sizes = {}
    for name, value in (("one", a[:BLOCK]), ("many", a)):
        p = str(tmp_path / name)
        sp.save_file({"v": value}, p, compression="none")
        sizes[name] = os.path.getsize(p + ".index")
    assert sizes["many"] - sizes["one"] == 4 * 64  # 64 crcs of 16 KiB blocks for 1 MiB
    assert struct.calcsize("<I") == 4
