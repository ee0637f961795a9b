"""Generate the format v1 golden checkpoints under tests/golden/v1/ and their expectation file
tests/golden/expected_v1.json. Run from the repository root:

    .venv/bin/python tests/golden/gen_golden.py

The data is fixed and seeded. The committed files are the contract: a later version of shardpoint
must keep reading them (tests/storage/test_golden.py in Python, tests/golden_v1.rs in Rust). Regenerate
only when the format version changes (then as v2/, keeping v1/). The script also prints the table
that tests/golden_v1.rs embeds.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys

import ml_dtypes
import numpy as np

import shardpoint as sp

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "v1")
EXPECTED = os.path.join(HERE, "expected_v1.json")


def tensors() -> dict[str, object]:
    rng = np.random.default_rng(20240601)
    w = (rng.standard_normal((64, 80)) * 0.05).astype(np.float32)
    partly = np.repeat(np.linspace(0, 1, 48, dtype=np.float32), 64)  # 3 chunks of 4 KiB...
    partly[1024:2048] = np.frombuffer(rng.bytes(4096), dtype=np.float32)  # ...the middle one raw
    return {
        "net/dense/kernel": w,  # 20 KB float32: byte-grouped zstd, 5 chunks of 4 KiB
        "net/partly_noise": partly,  # a compressed entry with one chunk stored raw
        "net/dense/bias": np.linspace(-1, 1, 80, dtype=np.float32),  # 1-d raw: dims inline
        "net/emb/bf16": (rng.standard_normal((100, 30)) * 0.1).astype(ml_dtypes.bfloat16),
        "net/f16/3d": rng.standard_normal((4, 5, 6)).astype(np.float16),  # raw, dims in aux
        "net/f64/wave": np.sin(np.arange(700) / 10.0),  # float64, compressed
        "quant/e4m3": (rng.standard_normal(6000) * 2).astype(
            ml_dtypes.float8_e4m3fn
        ),  # 1-byte: plain zstd
        "quant/e5m2": np.array(
            [0.0, -0.5, 1.5, 448.0, -3.0, 1e-3, 57344.0], dtype=ml_dtypes.float8_e5m2
        ),
        "ints/i64/ramp": np.arange(-500, 500, dtype=np.int64),
        "ints/i8": np.array([-128, -1, 0, 1, 127], dtype=np.int8),
        "ints/u16": np.arange(2500, dtype=np.uint16) * 7,
        "ints/u32": np.array([[0, 1], [2**32 - 1, 12345]], dtype=np.uint32),
        "ints/u64": np.array([2**64 - 1, 0, 2**63], dtype=np.uint64),
        "ints/i16": np.array([-32768, 32767], dtype=np.int16),
        "ints/i32": np.array([[-(2**31)], [2**31 - 1]], dtype=np.int32),
        "ints/u8/noise": np.frombuffer(rng.bytes(5000), dtype=np.uint8),  # incompressible: raw
        "complex/c64": (np.arange(600) * (1 + 0.5j)).astype(np.complex64),
        "complex/c128": np.array(
            [1 + 2j, -0.0 - 1j, complex(math.inf, math.nan)], dtype=np.complex128
        ),
        "mask/bool": np.array([True, False, False, True, True, False, True]),
        "scalar/f64": np.array(3.25),
        "scalar/bool": np.array(True),
        "scalar/i32": np.int32(-7),
        "empty/f32": np.zeros((0,), dtype=np.float32),
        "empty/i32/2d": np.zeros((3, 0), dtype=np.int32),
        "ключ/日本/ü": np.array([1.5, -2.5], dtype=np.float32),
        # typed values (FORMAT.md §6)
        "meta/step": 1234,
        "meta/bigint": -(2**100),
        "meta/lr": 0.001,
        "meta/nan": math.nan,
        "meta/name": "héllo wörld ✓",
        "meta/blob": b"\x00\x01\x02\xffshardpoint",
        "meta/config": {"layers": [64, 80], "act": "gelu", "dropout": 0.1, "tied": False},
        "meta/flag": True,
        "meta/none": None,
    }


CHECKPOINTS = {
    # name: (save_file keyword arguments, metadata)
    "mixed": (
        dict(compression="zstd", shards=2, chunk_bytes=4096),
        {"step": 1234, "note": "golden v1, two shards", "nested": {"a": [1, 2.5, None]}},
    ),
    "raw": (dict(compression="none", shards=1), {"note": "golden v1, uncompressed"}),
}


def describe(value: object) -> dict[str, object]:
    """The expectation record of one saved value."""
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        raw = np.ascontiguousarray(a).tobytes()
        return {
            "kind": "tensor",
            "dtype": a.dtype.name,
            "shape": list(a.shape),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "nbytes": len(raw),
        }
    if isinstance(value, bytes):
        return {"kind": "bytes", "hex": value.hex()}
    if isinstance(value, str):
        return {"kind": "str", "value": value}
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return {"kind": "json", "value": value}
    if isinstance(value, int):
        return {"kind": "int", "decimal": str(value)}
    if isinstance(value, float):
        return {"kind": "float", "repr": repr(value)}
    raise TypeError(type(value))


def dump_expected(expected: dict) -> str:
    """JSON with one line per entry (reviewable diffs)."""

    def js(v: object) -> str:
        return json.dumps(v, ensure_ascii=False, sort_keys=True)

    out = ["{", f' "format": {expected["format"]},', ' "checkpoints": {']
    names = list(expected["checkpoints"])
    for i, name in enumerate(names):
        ck = expected["checkpoints"][name]
        out.append(f"  {js(name)}: {{")
        out.append(f'   "files": {js(ck["files"])},')
        out.append(f'   "metadata": {js(ck["metadata"])},')
        out.append('   "entries": {')
        keys = sorted(ck["entries"])
        for j, k in enumerate(keys):
            out.append(f"    {js(k)}: {js(ck['entries'][k])}" + ("," if j + 1 < len(keys) else ""))
        out.append("   }")
        out.append("  }" + ("," if i + 1 < len(names) else ""))
    out += [" }", "}", ""]
    text = "\n".join(out)
    assert json.loads(text) == json.loads(js(expected))
    return text


def main() -> None:
    sys.path.insert(0, os.path.dirname(HERE))  # tests/, for the reference reader
    import reference_reader as rr

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    values = tensors()
    expected: dict[str, object] = {"format": 1, "checkpoints": {}}
    for name, (kwargs, metadata) in CHECKPOINTS.items():
        prefix = os.path.join(OUT, name)
        sp.save_file(values, prefix, metadata=metadata, durable=False, **kwargs)
        ck = rr.read_checkpoint(prefix)
        entries = {}
        for key, v in values.items():
            e = ck.entries[key]
            rec = describe(v)
            rec.update(
                codec=e.codec,
                shard=e.shard,
                raw_len=e.raw_len,
                crc32c=e.crc,
                raw_sha256=hashlib.sha256(ck.raw[key]).hexdigest(),
            )
            if rec["kind"] == "tensor":
                assert rec["sha256"] == rec["raw_sha256"] and rec["shape"] == list(e.dims), key
            entries[key] = rec
        expected["checkpoints"][name] = {
            "files": sorted(f for f in os.listdir(OUT) if f.startswith(name + ".")),
            "metadata": metadata,
            "entries": entries,
        }
    with open(EXPECTED, "w", encoding="utf-8") as f:
        f.write(dump_expected(expected))
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, under {OUT}", file=sys.stderr)
    # The table embedded in tests/golden_v1.rs (codec/shard are those of `mixed`; every entry
    # of `raw` is codec none in shard 0).
    mixed = expected["checkpoints"]["mixed"]["entries"]
    for key in sorted(mixed, key=lambda k: k.encode()):
        rec = mixed[key]
        dims = rec["shape"] if rec["kind"] == "tensor" else [rec["raw_len"]]
        print(
            f'    G {{ key: "{key}", kind: "{rec["kind"]}", dtype: "{rec.get("dtype", "uint8")}", '
            f"dims: &{dims}, raw_len: {rec['raw_len']}, crc: 0x{rec['crc32c']:08x}, "
            f'codec: "{rec["codec"]}", shard: {rec["shard"]} }},'
        )


if __name__ == "__main__":
    main()
