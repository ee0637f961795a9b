"""Crafted hostile checkpoints: each is a valid checkpoint with one semantic defect and every crc
recomputed, so the reader's bounds/consistency checks (not its checksums) must refuse it.

``CASES`` maps a case name to ``(build, expected)``: ``build(dir) -> prefix`` writes the files,
``expected`` is the name of the ``shardpoint.errors`` class that reading must raise (or a tuple
of acceptable names). :func:`exercise` opens the checkpoint and touches everything a user can
(keys, every value, metadata, verify): the first error raised is the verdict.

Also runnable as a script (``python -m reliability_helpers.hostile_cases CASE...``) so that a
test can run the cases in a child process and measure its peak RSS, or survive an abort.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reliability_helpers.craft import (  # noqa: E402
    CEntry,
    CShard,
    chunk_entry,
    crc32c,
    raw_entry,
    write_checkpoint,
    zstd_frame,
)

CB = 4096  # chunk_bytes of the crafted checkpoints
CORRUPT = "CorruptCheckpointError"


def base_entries() -> list[CEntry]:
    """a: raw float32 vector; b: 3-chunk zstd float32 matrix; c: a str value."""
    a = np.arange(3000, dtype=np.float32).tobytes()
    b = (np.arange(3000, dtype=np.float32) % 7).tobytes()
    return [
        raw_entry(b"a", "float32", [3000], a),
        chunk_entry(b"b", "float32", [30, 100], b, CB),
        raw_entry(b"c", "uint8", [5], b"hello", kind="str"),
    ]


def _write(d: str, name: str, entries: list[CEntry], **kw: object) -> str:
    p = os.path.join(d, name)
    write_checkpoint(p, entries, chunk_bytes=CB, **kw)  # type: ignore[arg-type]
    return p


def _with(mutate: Callable[[list[CEntry]], None], **kw: object) -> Callable[[str], str]:
    def build(d: str) -> str:
        es = base_entries()
        mutate(es)
        return _write(d, "ck", es, **kw)

    return build


def _set(i: int, **fields: object) -> Callable[[list[CEntry]], None]:
    def m(es: list[CEntry]) -> None:
        for k, v in fields.items():
            setattr(es[i], k, v)

    return m


def _many_keys(order: Callable[[list[bytes]], list[bytes]]) -> Callable[[str], str]:
    """130 entries (3 blocks of the index) with keys in the order ``order`` gives."""

    def build(d: str) -> str:
        keys = order([f"k{i:04d}".encode() for i in range(130)])
        es = [raw_entry(k, "uint8", [1], bytes([i % 256])) for i, k in enumerate(keys)]
        return _write(d, "ck", es)

    return build


def _swap_across_blocks(keys: list[bytes]) -> list[bytes]:
    # every block is internally sorted, but block 1 holds keys that sort before block 0's
    return keys[64:128] + keys[:64] + keys[128:]


def _bomb(d: str) -> str:
    # one 4096-byte chunk whose zstd frame decodes to 1 MiB (decompression bomb)
    frame = zstd_frame(bytes(1 << 20))
    e = CEntry(b"bomb", "uint8", "zstd", "tensor", [CB], frame, [(0, len(frame), crc32c(frame))])
    e.crc = crc32c(bytes(CB))
    return _write(d, "ck", [e])


def _short_frame(d: str) -> str:
    # the frame decodes to fewer bytes than the chunk's raw length
    frame = zstd_frame(bytes(100))
    e = CEntry(b"short", "uint8", "zstd", "tensor", [CB], frame, [(0, len(frame), crc32c(frame))])
    e.crc = crc32c(bytes(CB))
    return _write(d, "ck", [e])


def _bytegroup_bomb(d: str) -> str:
    # a zstd-bytegroup float32 chunk whose first plane segment decodes to 1 MiB instead of n
    n = CB // 4
    frame = zstd_frame(bytes(1 << 20))
    stored = struct.pack("<I", len(frame)) + frame
    for _ in range(3):
        stored += struct.pack("<I", 1) + b"\0"  # not a valid frame: never reached
    e = CEntry(b"bg", "float32", "zstd-bytegroup", "tensor", [n], stored)
    e.chunks = [(0, len(stored), crc32c(stored))]
    e.crc = crc32c(bytes(CB))
    return _write(d, "ck", [e])


def _segment_too_long(d: str) -> str:
    n = CB // 4
    stored = struct.pack("<I", n + 1) + bytes(20)
    e = CEntry(b"bg", "float32", "zstd-bytegroup", "tensor", [n], stored)
    e.chunks = [(0, len(stored), crc32c(stored))]
    e.crc = crc32c(bytes(CB))
    return _write(d, "ck", [e])


def _overlapping_chunks(d: str) -> str:
    # 64 chunk records that all point at the same small frame: every crc is right, the data
    # decodes (to zeros), but §3.3 says chunks are contiguous and non-overlapping, "checked on
    # every use": an amplification vector, 1 frame -> any number of chunks
    frame = zstd_frame(bytes(CB))
    nch = 64
    e = CEntry(b"amp", "uint8", "zstd", "tensor", [CB * nch], frame)
    e.chunks = [(0, len(frame), crc32c(frame))] * nch
    e.crc = crc32c(bytes(CB * nch))
    return _write(d, "ck", [e])


def _huge_claim(d: str) -> str:
    # 1 TiB declared by a 256 KiB index and a 2 KiB shard (chunk_bytes 64 MiB, 16384 records
    # all naming one frame): a reader must refuse or fail cleanly, never abort the process
    cb = 64 << 20
    n = 1 << 40
    frame = zstd_frame(bytes(cb))
    e = CEntry(b"huge", "uint8", "zstd", "tensor", [n], frame)
    e.chunks = [(0, len(frame), crc32c(frame))] * (n // cb)
    e.crc = 0
    p = os.path.join(d, "ck")
    write_checkpoint(p, [e], chunk_bytes=cb)
    return p


def _deep_json_value(depth: int) -> Callable[[str], str]:
    def build(d: str) -> str:
        text = ("[" * depth + "]" * depth).encode()
        return _write(d, "ck", [raw_entry(b"j", "uint8", [len(text)], text, kind="json")])

    return build


def _deep_metadata(depth: int) -> Callable[[str], str]:
    def build(d: str) -> str:
        user = "[" * depth + "]" * depth
        meta = f'{{"format":1,"writer":"craft","user":{{"x":{user}}}}}'.encode()
        return _write(d, "ck", base_entries(), meta=meta)

    return build


def _bad_shard_name(name: bytes, name_len: int | None = None) -> Callable[[str], str]:
    def build(d: str) -> str:
        es = base_entries()
        # write the real shard under the valid name, then point the record at `name`
        p = _write(d, "ck", es)
        shard = CShard(name=name, name_len=name_len)
        good = CShard()
        from reliability_helpers.craft import build_index, write_shards

        write_shards(p, es, [good])
        shard.file_len, shard.header_crc, shard.token = good.file_len, good.header_crc, good.token
        with open(p + ".index", "wb") as f:
            f.write(build_index(es, [shard], chunk_bytes=CB))
        return p

    return build


def _escape_target(d: str) -> str:
    """A real, valid shard placed *outside* the checkpoint directory, named by ``../``."""
    inner = os.path.join(d, "inner")
    # `inner/ck/` exists as a directory, so `inner/ck` + "/../../x" really resolves to `d/x`:
    # only the name check stands between the index and a file outside its directory
    os.makedirs(os.path.join(inner, "ck"), exist_ok=True)
    es = base_entries()
    outside = CShard(name=b".data-00000-of-00001")
    from reliability_helpers.craft import build_index, write_shards

    write_shards(os.path.join(d, "ck"), es, [outside])  # d/ck.data-00000-of-00001
    hostile = CShard(
        name=b"/../../ck.data-00000-of-00001",
        file_len=outside.file_len,
        header_crc=outside.header_crc,
        token=outside.token,
    )
    p = os.path.join(inner, "ck")
    with open(p + ".index", "wb") as f:
        f.write(build_index(es, [hostile], chunk_bytes=CB))
    return p


def _hdr(**fields: int) -> Callable[[str], str]:
    return _with(lambda es: None, header=fields)


def _overflow_dims(es: list[CEntry]) -> None:
    es[1].dims = [1 << 32, 1 << 32, 1 << 4]


def _overlap(d: str) -> str:
    # "c" points into "a"'s payload, with the crc of those bytes: only the overlap check of
    # verify() can tell (the spec does not check overlaps on every read)
    es = base_entries()
    a_raw = es[0].payload
    es[2].payload = b""
    es[2].offset = 4096
    es[2].stored_len = 5
    es[2].dims = [5]
    es[2].crc = crc32c(a_raw[:5])
    return _write(d, "ck", es)


# name -> (build, expected class name(s), stage). Stage "read": refused by open/keys/lookups/
# loads alone (the spec's "checked on every use"); "verify": only ``verify()`` must refuse it.
Case = (
    tuple[Callable[[str], str], str | tuple[str, ...]]
    | tuple[Callable[[str], str], str | tuple[str, ...], str]
)
CASES: dict[str, Case] = {
    # -- the index header and its sections
    "entry_count_absurd": (_hdr(entry_count=1 << 60), CORRUPT),
    "entry_count_u64_max": (_hdr(entry_count=2**64 - 1), CORRUPT),
    "shard_count_absurd": (_hdr(shard_count=2**32 - 1), CORRUPT),
    "keys_len_past_end": (_hdr(keys_len=1 << 62), CORRUPT),
    "meta_len_wraps": (_hdr(meta_len=2**64 - 8), CORRUPT),
    "sections_overlap": (_hdr(keys_off=200), CORRUPT),
    "section_misaligned": (_hdr(entries_off=131), CORRUPT),
    "file_len_lies": (_hdr(file_len=1 << 40), CORRUPT),
    "chunk_bytes_zero": (_hdr(chunk_bytes=0), CORRUPT),
    "chunk_bytes_odd": (_hdr(chunk_bytes=4097), CORRUPT),
    "header_len_wrong": (_hdr(header_len=64), CORRUPT),
    # -- entry records
    "offset_past_end": (_with(_set(0, offset=1 << 40)), CORRUPT),
    "offset_wraps_u64": (_with(_set(0, offset=2**64 - 64)), CORRUPT),
    "offset_inside_header": (_with(_set(0, offset=64)), CORRUPT),
    "offset_misaligned": (_with(_set(0, offset=4096 + 8)), CORRUPT),
    "stored_len_past_end": (_with(_set(0, stored_len=1 << 30, inline_dims=False)), CORRUPT),
    "payloads_overlap": (_overlap, CORRUPT, "verify"),
    "shape_overflows": (_with(_overflow_dims), CORRUPT),
    "shape_mismatch": (_with(_set(0, dims=[3000, 2], inline_dims=False)), CORRUPT),
    # empty shapes no array can hold: the product is 0, but numpy refuses a dimension above
    # 2^63 - 1, or non-zero dims whose byte size is (it would raise ValueError, not ours)
    "shape_zero_by_u64_max": (_with(_set(0, dims=[0, 2**64 - 1], payload=b"")), CORRUPT),
    "shape_zero_by_2_63": (_with(_set(0, dims=[0, 2**63], payload=b"")), CORRUPT),
    "shape_zero_bytes_past_isize": (_with(_set(0, dims=[2**61, 0, 2], payload=b"")), CORRUPT),
    "ndim_65": (_with(_set(1, dims=[1] * 64 + [3000 * 4 // 4], ndim=65)), CORRUPT),
    "dtype_tag_unknown": (_with(_set(0, dtype=99)), CORRUPT),
    "codec_tag_unknown": (_with(_set(0, codec=7)), CORRUPT),
    "kind_tag_unknown": (_with(_set(2, kind=42)), CORRUPT),
    "typed_entry_not_u8": (_with(_set(0, kind="str")), CORRUPT),
    "reserved_bytes_set": (_with(_set(0, reserved=b"\x01\x00")), CORRUPT),
    "shard_index_out_of_range": (_with(_set(0, shard=7)), CORRUPT),
    "stored_len_gt_raw": (_with(_set(1, stored_len=50_000)), CORRUPT),
    "chunk_longer_than_raw": (
        _with(lambda es: setattr(es[1], "chunks", [(0, 5000, 0)] + es[1].chunks[1:])),
        CORRUPT,
    ),
    "chunk_past_payload": (
        _with(lambda es: setattr(es[1], "chunks", [(1 << 40, 10, 0)] + es[1].chunks[1:])),
        CORRUPT,
    ),
    "chunk_table_missing": (_with(_set(1, chunks=[])), CORRUPT),
    # -- payload decoding
    "zstd_bomb": (_bomb, CORRUPT),
    "zstd_short_frame": (_short_frame, CORRUPT),
    "bytegroup_bomb": (_bytegroup_bomb, CORRUPT),
    "bytegroup_segment_too_long": (_segment_too_long, CORRUPT),
    "overlapping_chunk_records": (_overlapping_chunks, CORRUPT),
    "huge_declared_size": (_huge_claim, (CORRUPT, "MemoryError", "CheckpointIOError")),
    # -- keys
    # (the hostile key replaces "c" and still sorts last: only the key check can refuse it)
    "key_invalid_utf8": (_with(_set(2, key=b"c\xff\xfe")), CORRUPT),
    "key_with_nul": (_with(_set(2, key=b"c\0")), CORRUPT),
    "key_overlong_utf8": (_with(_set(2, key=b"c\xc0\xaf")), CORRUPT),
    "key_surrogate_utf8": (_with(_set(2, key=b"c\xed\xa0\x80")), CORRUPT),
    "keys_unsorted_in_block": (_with(lambda es: es.reverse()), CORRUPT),
    "keys_duplicate": (_with(_set(1, key=b"a")), CORRUPT),
    "keys_unsorted_across_blocks": (_many_keys(_swap_across_blocks), CORRUPT),
    # -- shard references
    "shard_name_dotdot": (_bad_shard_name(b"/../../etc/passwd"), CORRUPT),
    "shard_name_escapes_dir": (_escape_target, CORRUPT),
    "shard_name_absolute": (_bad_shard_name(b"/etc/passwd"), CORRUPT),
    "shard_name_nul": (_bad_shard_name(b".data-00000-of-00001\0x"), CORRUPT),
    "shard_name_len_zero": (_bad_shard_name(b".data-00000-of-00001", 0), CORRUPT),
    "shard_name_len_huge": (_bad_shard_name(b".data-00000-of-00001", 2**32 - 1), CORRUPT),
    "shard_name_upper_hex": (_bad_shard_name(b".data-00000-of-00001.DEADBEEFDEADBEEF"), CORRUPT),
    # -- JSON
    "metadata_deep_200": (_deep_metadata(200), CORRUPT),
    "metadata_deep_100k": (_deep_metadata(100_000), CORRUPT),
    "metadata_not_utf8": (_with(lambda es: None, meta=b'{"user":"\xff"}'), CORRUPT),
    "metadata_not_json": (_with(lambda es: None, meta=b"{not json"), CORRUPT),
    "json_value_deep_200": (_deep_json_value(200), CORRUPT),
    "json_value_deep_100k": (_deep_json_value(100_000), CORRUPT),
    "int_value_garbage": (
        lambda d: _write(d, "ck", [raw_entry(b"i", "uint8", [3], b"1x2", kind="int")]),
        CORRUPT,
    ),
    "float_value_garbage": (
        lambda d: _write(d, "ck", [raw_entry(b"f", "uint8", [3], b"1e+", kind="float")]),
        CORRUPT,
    ),
}


def case(name: str) -> tuple[Callable[[str], str], tuple[str, ...], str]:
    """(build, acceptable class names, stage) of case ``name``."""
    c = CASES[name]
    exp = c[1] if isinstance(c[1], tuple) else (c[1],)
    return c[0], exp, (c[2] if len(c) == 3 else "read")  # type: ignore[misc]


def exercise(prefix: str, verify: bool) -> None:
    """Everything a user can do with a checkpoint (and ``verify()`` when asked); raises on the
    first refusal."""
    import shardpoint as sp

    sp.load_file(prefix)
    with sp.open(prefix) as r:
        keys = r.keys()
        for k in keys:
            r.info(k)
            assert k in r, f"{k!r} is listed by keys() but `in` says it is absent"
            r[k]
            r.get(k, verify=True)
        r.load(keys, verify=False)
        json.dumps(r.metadata)
        if verify:
            r.verify()


def outcome(prefix: str, verify: bool) -> tuple[str, str]:
    """(exception class name or "ok", message) of :func:`exercise`."""
    try:
        exercise(prefix, verify)
    except Exception as e:  # noqa: BLE001 - the class is the verdict
        return type(e).__name__, str(e)
    return "ok", ""


def _main(argv: list[str]) -> None:
    """Run cases in this process; one JSON line per case with class, seconds and peak RSS."""
    import tempfile

    import shardpoint  # noqa: F401  (import cost outside the measured window)

    print(json.dumps({"case": None, "maxrss_kb": _maxrss()}), flush=True)
    for name in argv:
        build, _, stage = case(name)
        with tempfile.TemporaryDirectory() as d:
            prefix = build(d)
            print(json.dumps({"start": name}), flush=True)
            t = time.perf_counter()
            cls, msg = outcome(prefix, verify=stage == "verify")
            dt = time.perf_counter() - t
        line = {"case": name, "cls": cls, "msg": msg[:300], "s": dt, "maxrss_kb": _maxrss()}
        print(json.dumps(line), flush=True)


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    _main(sys.argv[1:])
