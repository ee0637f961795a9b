"""Regenerate the seed corpus of the fuzz targets (small valid inputs of each decoder).

    .venv/bin/python fuzz/gen_corpus.py

index: real index files written by shardpoint (1 and 3 index blocks, raw/compressed/typed
entries, two shards); shard_header: real shard headers; chunk: 4-byte selector (codec, dtype,
raw length - 1, as fuzz_targets/logic.rs reads it) + a real stored chunk of each codec.
"""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np

import shardpoint as sp

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPE_INDEX = {
    "uint8": 5,
    "float16": 9,
    "bfloat16": 10,
    "float32": 11,
    "float64": 12,
}  # into ALL_DTYPES
CODEC_INDEX = {"none": 0, "zstd": 1, "zstd-bytegroup": 2, "bytegroup-huffman": 3}


def out(target: str, name: str, data: bytes) -> None:
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main() -> None:
    with tempfile.TemporaryDirectory() as t:
        smooth = (np.sin(np.arange(3000, dtype=np.float32) * 0.01) * 0.02).astype(np.float32)
        vals = {
            "a/raw": np.arange(100, dtype=np.int64),
            "a/smooth": smooth.reshape(30, 100),
            "b/scalar": np.float64(1.5),
            "b/empty": np.zeros((0, 4), np.float16),
            "c/text": "hello",
            "c/json": {"x": [1, 2]},
            "c/int": 7,
        }
        sp.save_file(vals, t + "/mixed", shards=2, chunk_bytes=4096)
        sp.save_file({f"k{i:04d}": np.uint8(i % 256) for i in range(130)}, t + "/blocks")
        sp.save_file({"x": np.arange(10, dtype=np.float32)}, t + "/tiny", compression="none")
        # an uncompressed value of 4 crc blocks (FORMAT.md §3.4), 2-d so its dims are in aux
        crc_blocks = {"w": np.arange(12800, dtype=np.float32).reshape(100, 128)}
        sp.save_file(crc_blocks, t + "/crcblocks", compression="none")
        # hashed shard names (FORMAT.md §3.1.1): a version 2 index
        sp.save_file(vals, t + "/hashed", shards=3, chunk_bytes=4096, hashed_prefixes=True)
        for name in ("mixed", "blocks", "tiny", "crcblocks", "hashed"):
            with open(f"{t}/{name}.index", "rb") as f:
                out("index", f"{name}.index", f.read())
        for fn in sorted(os.listdir(t)):
            if ".data-" in fn:
                with open(os.path.join(t, fn), "rb") as f:
                    out("shard_header", fn.replace(".", "_"), f.read(64))
        # chunks: one entry per codec/dtype small enough to be a single chunk
        raw_f32 = smooth[:1024].tobytes()
        import ml_dtypes

        raw_bf16 = smooth[:2048].astype(ml_dtypes.bfloat16).tobytes()
        raw_u8 = bytes(i % 7 for i in range(4096))
        raw_f16 = smooth[:2048].astype(np.float16).tobytes()
        const = np.zeros(1024, np.float32).tobytes()  # constant planes (mode 0)
        cases = [
            ("zstd-bytegroup", "float32", raw_f32, "zstd-bytegroup"),
            ("zstd-bytegroup", "bfloat16", raw_bf16, "zstd-bytegroup"),
            ("bytegroup-huffman", "float32", raw_f32, "zstd"),
            ("bytegroup-huffman", "bfloat16", raw_bf16, "zstd"),
            ("bytegroup-huffman", "float16", raw_f16, "zstd"),
            ("bytegroup-huffman", "float64", raw_f32 + raw_f32, "zstd"),
            ("zstd", "float32", raw_f32, "zstd-plain"),
            ("zstd", "uint8", raw_u8, "zstd"),
        ]
        cases.append(("bytegroup-huffman", "float32", const, "zstd"))
        for codec, dtype, raw, compression in cases:
            arr = np.frombuffer(raw, dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
            p = f"{t}/c"
            sp.save_file({"x": arr}, p, compression=compression, chunk_bytes=len(raw))
            with sp.open(p) as r:
                info = r.info("x")
                shard, _ = r.format_info["shards"][0]
            assert info.codec == codec and info.chunks == 1, info
            with open(shard, "rb") as f:
                f.seek(info.offset)
                stored = f.read(info.stored_bytes)
            sel = struct.pack("<BBH", CODEC_INDEX[codec], DTYPE_INDEX[dtype], len(raw) - 1)
            name = f"{codec}_{dtype}" + ("_const" if raw is const else "")
            out("chunk", name, sel + stored)
        out("chunk", "none_uint8", struct.pack("<BBH", 0, 5, 15) + bytes(range(16)))


if __name__ == "__main__":
    main()
