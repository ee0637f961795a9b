"""Issue 12 items 8 and 14: hostile and damaged inputs to the converters.

8. A TensorBundle index whose entries each "share all of the previous key and add one byte"
   describes quadratically many key bytes in a few hundred KiB. Parsing must stop with a clear
   error while the process's peak memory stays bounded by the input size (measured in a child
   process: ``ru_maxrss`` growth during the parse). The TensorBundle crc32c is the core's.
14. A truncated ``.safetensors`` given to ``shardpoint convert`` is reported as damaged
    (exit 1), not as an unknown format (exit 2).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from shardpoint.cli import main
from shardpoint.convert.tensorbundle import TABLE_MAGIC, crc32c, mask_crc


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _framed(out: bytearray, block: bytes) -> bytes:
    """Append ``block`` with its LevelDB trailer; return its BlockHandle."""
    handle = _varint(len(out)) + _varint(len(block))
    out += block + b"\0" + mask_crc(crc32c(block + b"\0")).to_bytes(4, "little")
    return handle


def _hostile_index(first_key_len: int, entries: int) -> bytes:
    """One data block: the header entry, a long key, then ``entries`` keys each sharing all of
    the previous key and adding one byte (4-6 bytes of input each, a key one byte longer each
    time)."""
    header = b"\x08\x01"  # BundleHeaderProto {num_shards: 1}
    blk = bytearray(_varint(0) + _varint(0) + _varint(len(header)) + header)
    blk += _varint(0) + _varint(first_key_len) + _varint(0) + b"k" * first_key_len
    for i in range(entries):
        blk += _varint(first_key_len + i) + _varint(1) + _varint(0) + b"z"
    blk += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart at 0
    out = bytearray()
    data = _framed(out, bytes(blk))
    meta = _framed(out, (0).to_bytes(4, "little") + (1).to_bytes(4, "little"))
    sep = b"\xff"
    index_block = _varint(0) + _varint(len(sep)) + _varint(len(data)) + sep + data
    index_block += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")
    idx = _framed(out, index_block)
    return bytes(out + (meta + idx).ljust(40, b"\0") + TABLE_MAGIC.to_bytes(8, "little"))


_PARSE_CHILD = textwrap.dedent(
    """
    import resource, sys, time
    import shardpoint as sp
    from shardpoint.convert.tensorbundle import TensorBundleReader
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    try:
        TensorBundleReader(sys.argv[1])
        outcome = "parsed"
    except sp.CorruptCheckpointError as e:
        outcome = "corrupt:" + str(e)[:300]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) * 1024, time.perf_counter() - t, outcome)
    """
)


def test_hostile_tensorbundle_index_is_refused_with_bounded_memory(tmp_path):
    prefix = str(tmp_path / "tf")
    blob = _hostile_index(first_key_len=2000, entries=60_000)
    with open(prefix + ".index", "wb") as f:
        f.write(blob)
    # materialised naively: 60k keys of 2000..62000 bytes, about 1.9 GB
    out = subprocess.run(
        [sys.executable, "-c", _PARSE_CHILD, prefix], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    grown, seconds, outcome = out.stdout.split(" ", 2)
    assert outcome.startswith("corrupt:") and "keys expand" in outcome, outcome
    # bounded by the input: the key budget (64 MiB + 32 x input) plus interpreter slack
    budget = (64 << 20) + 32 * len(blob)
    assert int(grown) < 2 * budget, (int(grown), len(blob))
    print(
        f"hostile TensorBundle: input {len(blob)} B, peak RSS growth {int(grown)} B, "
        f"{float(seconds):.2f} s"
    )
    assert main(["ls", prefix]) == 1


def test_tensorbundle_crc_is_native_speed():
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    t = time.perf_counter()
    c = crc32c(data)
    dt = time.perf_counter() - t
    assert (
        c
        == crc32c(data[: 1 << 20] + data[1 << 20 :])
        == crc32c(data[1 << 20 :], crc32c(data[: 1 << 20]))
    )
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert dt < 1.0  # the pure-Python loop needed ~1.5 s for 8 MiB at 5.7 MB/s


def _safetensors(path: str) -> bytes:
    import json

    header = json.dumps({"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}).encode()
    header += b" " * (-len(header) % 8)
    blob = len(header).to_bytes(8, "little") + header + np.arange(64, dtype=np.float32).tobytes()
    with open(path, "wb") as f:
        f.write(blob)
    return blob


@pytest.mark.parametrize(
    "keep", [4, 20, 60, -10], ids=["in-length", "in-header", "mid-header", "in-data"]
)
def test_truncated_safetensors_is_reported_damaged(tmp_path, keep, capsys):
    src = str(tmp_path / "m.safetensors")
    blob = _safetensors(src)
    assert main(["convert", src, str(tmp_path / "ok")]) == 0
    with open(src, "wb") as f:
        f.write(blob[:keep])
    assert main(["convert", src, str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "m.safetensors" in err and "unknown file format" not in err, err
