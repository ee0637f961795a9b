"""Hostile object entries (FORMAT.md §6.1, issue 36 parts 2 and 3).

- The 64 MiB bound of an object entry is checked on its index record, before any byte of it
  is read or decompressed: a small file claiming a 1 GiB object costs no memory for the claim
  (measured as the peak RSS of a child process).
- Whatever a payload makes a type's constructor raise (``decimal.Decimal("posix.system")``
  raises ``decimal.InvalidOperation``, an ``ArithmeticError``) comes out as
  ``CorruptCheckpointError`` naming the key, the original chained as its cause. A seeded fuzzer
  feeds the decoder tens of thousands of well-formed-JSON payloads (the bytes a reader sees once
  every crc matches) and allows only shardpoint's errors out, and a few hundred of them go
  through real files as well.
"""

from __future__ import annotations

import base64
import decimal
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers import craft
from shardpoint import _core
from shardpoint.storage.object_types import _HANDLERS
from shardpoint.storage.objects import MAX_OBJECT_BYTES, decode_object, encode_object

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
GIB = 1 << 30


def test_the_bound_is_the_cores() -> None:
    """Python's documented bound and the one the core enforces on index records are one."""
    assert MAX_OBJECT_BYTES == _core.MAX_OBJECT_BYTES == 64 << 20


def _object_entry(key: bytes, doc: bytes) -> craft.CEntry:
    return craft.raw_entry(key, "uint8", [len(doc)], doc, kind="object")


def test_decimal_payload_raises_shardpoint_error_naming_the_key(tmp_path) -> None:
    """The issue's reproduction, through a real file with every crc right."""
    p = str(tmp_path / "ck")
    doc = json.dumps({"v": 1, "value": {"decimal.Decimal": "posix.system"}}).encode()
    craft.write_checkpoint(p, [_object_entry(b"cfg/lr", doc)])
    with sp.open(p) as r:
        with pytest.raises(sp.CorruptCheckpointError, match=r"cfg/lr.*decimal\.Decimal") as ei:
            r["cfg/lr"]
    assert isinstance(ei.value.__cause__, decimal.InvalidOperation)
    with pytest.raises(sp.CorruptCheckpointError, match=r"cfg/lr"):
        sp.load_file(p)


# --------------------------------------------------------------------------------------------
# A seeded fuzzer of the object decoder
# --------------------------------------------------------------------------------------------

_NASTY_STR = [
    "",
    "posix.system",
    "os.system",
    "nan",
    "-inf",
    "1e999999",
    "0x",
    "-0x",
    "0xzz",
    "0x" + "f" * 300,
    "9" * 5000,
    "2024-13-45",
    "25:61:61",
    "2024-02-30T00:00:00+99:00",
    "a" * 300,
    "\udc80",
    "\x00",
    "../../etc/passwd",
    "C:\\x",
    "float32",
    "float64",
    "bool",
    "complex64",
    "not-a-dtype",
    "AAAA",
    "AAA",
    "=",
    "////",
    "0011ff",
    "0g",
    "12345678-1234-5678-1234-567812345678",
    "{",
    "sNaN",
    "Infinity",
]
_NASTY_NUM: list[Any] = [
    0,
    1,
    -1,
    2**63,
    -(2**64),
    10**400,
    0.5,
    -0.0,
    float("nan"),
    float("inf"),
    1e308,
    999999999,
    -999999999,
    86400 * 10**6,
    True,
    False,
    None,
]
_USER_TAGS = ["dataclass", "namedtuple", "enum", "object"]


class _Gen:
    """Random JSON nodes, biased towards the shapes the decoder's handlers look for."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.tags = sorted(_HANDLERS) + _USER_TAGS + ["no.such.tag", "", "__class__"]

    def scalar(self) -> Any:
        r = self.r
        k = r.random()
        if k < 0.45:
            return r.choice(_NASTY_STR)
        if k < 0.85:
            return r.choice(_NASTY_NUM)
        return r.choice(
            [
                r.randint(-5, 70),
                r.random() * 1e6,
                "".join(r.choices("0123456789abcdef-x.:T", k=r.randint(0, 12))),
            ]
        )

    def payload(self, depth: int) -> Any:
        r = self.r
        k = r.random()
        if depth > 4 or k < 0.4:
            return self.scalar()
        if k < 0.75:
            return [self.node(depth + 1) for _ in range(r.randint(0, 4))]
        if k < 0.85:  # user-tag shaped: [name, state]
            return [r.choice(["x.Y", "", "decimal.Decimal", "builtins.eval"]), self.node(depth + 1)]
        return {
            r.choice(_NASTY_STR[:12] + ["value", "a"]): self.node(depth + 1)
            for _ in range(r.randint(0, 3))
        }

    def node(self, depth: int = 0) -> Any:
        r = self.r
        k = r.random()
        if depth > 5 or k < 0.3:
            return self.scalar()
        if k < 0.45:
            return [self.node(depth + 1) for _ in range(r.randint(0, 3))]
        if k < 0.95:
            return {r.choice(self.tags): self.payload(depth + 1)}
        return {r.choice(self.tags): self.payload(depth + 1), "extra": 1}

    def document(self) -> bytes:
        r = self.r
        k = r.random()
        if k < 0.85:
            doc: Any = {"v": 1, "value": self.node()}
        elif k < 0.9:
            doc = {"v": r.choice([0, 2, -1, "1", 1.0, None]), "value": self.node()}
        elif k < 0.95:
            doc = self.node()
        else:  # a valid document with one character changed
            text = encode_object("k", _valid_value(r))
            i = r.randrange(len(text))
            return text[:i] + bytes([r.randrange(32, 127)]) + text[i + 1 :]
        return json.dumps(doc, allow_nan=True).encode()


def _valid_value(r: random.Random) -> Any:
    return r.choice(
        [
            {1: "a", (2, 3): {4.5, 6}},
            decimal.Decimal("1.25"),
            np.float16(3.5),
            np.arange(6, dtype=np.int32).reshape(2, 3),
            (b"xy", bytearray(b"z"), complex(1, 2)),
            frozenset({"a", "b"}),
        ]
    )


def _decode_one(raw: bytes) -> str:
    """'ok' or 'error' for the payload; anything but shardpoint's errors fails the test."""
    try:
        decode_object("fuzz/key", raw)
    except sp.CheckpointError as e:
        assert "fuzz/key" in str(e), f"error does not name the key: {e!r}"
        return "error"
    except BaseException as e:
        pytest.fail(f"{type(e).__name__} escaped the object decoder on {raw[:300]!r}: {e!r}")
    return "ok"


def test_fuzzed_payloads_raise_only_shardpoint_errors() -> None:
    """30,000 crc-consistent payloads (the decoder sees exactly these bytes) in a few seconds:
    each decodes or raises a ``CheckpointError`` naming the key; both outcomes occur."""
    g = _Gen(seed=36)
    seen = {"ok": 0, "error": 0}
    decimals = 0  # the reported payload's shape: a Decimal tag with a string that is no number
    t = time.perf_counter()
    for _ in range(30_000):
        raw = g.document()
        decimals += b'"decimal.Decimal": "' in raw
        seen[_decode_one(raw)] += 1
    assert seen["ok"] > 1000 and seen["error"] > 1000, seen
    assert decimals > 100
    issue = json.dumps({"v": 1, "value": {"decimal.Decimal": "posix.system"}}).encode()
    assert _decode_one(issue) == "error"
    assert time.perf_counter() - t < 60, "the fuzzer is meant to run in seconds"


def test_fuzzed_payloads_through_real_files(tmp_path) -> None:
    """300 fuzzed payloads as object entries of one crafted checkpoint (every crc right), read
    by key, by ``load(keys=[...])`` and by ``load_file``: only shardpoint's errors come out."""
    g = _Gen(seed=3636)
    docs = {f"k{i:03d}".encode(): g.document() for i in range(300)}
    p = str(tmp_path / "ck")
    craft.write_checkpoint(p, [_object_entry(k, d) for k, d in docs.items()])
    outcomes = set()
    with sp.open(p) as r:
        for k in docs:
            key = k.decode()
            for read in (r.__getitem__, lambda k: r.load([k])):
                try:
                    read(key)
                    outcomes.add("ok")
                except sp.CheckpointError as e:
                    assert key in str(e), e
                    outcomes.add("error")
    assert outcomes == {"ok", "error"}
    with pytest.raises(sp.CheckpointError):
        sp.load_file(p)


# --------------------------------------------------------------------------------------------
# The size bound, before decompression
# --------------------------------------------------------------------------------------------


def _bomb(prefix: str, claim: int, chunk_bytes: int = 64 << 20) -> None:
    """An object entry whose raw bytes are the JSON of a ``claim``-byte string, stored as zstd
    chunks of 64 MiB (a few KiB each on disk); crcs all right. Built without ever holding
    more than two chunks of raw bytes."""
    head = b'{"v":1,"value":"'
    tail = b'"}'
    assert claim % chunk_bytes == 0 and claim > 2 * chunk_bytes
    filler = b"a" * chunk_bytes
    first = head + filler[len(head) :]
    last = filler[: chunk_bytes - len(tail)] + tail
    frames = {id(x): craft.zstd_frame(x) for x in (first, filler, last)}
    payload = bytearray()
    chunks = []
    crc = 0
    n = claim // chunk_bytes
    for i in range(n):
        raw = first if i == 0 else last if i == n - 1 else filler
        f = frames[id(raw)]
        chunks.append((len(payload), len(f), _core.crc32c(f)))
        payload += f
        crc = _core.crc32c(raw, crc)
    e = craft.CEntry(b"obj", "uint8", "zstd", "object", [claim], bytes(payload), chunks, crc=crc)
    craft.write_checkpoint(prefix, [e], chunk_bytes=chunk_bytes)


_MEASURE = r"""
import resource, sys
import shardpoint as sp
p, how = sys.argv[1], sys.argv[2]
r = sp.open(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    if how == "getitem":
        r["obj"]
    elif how == "load":
        r.load()
    else:
        sp.load_file(p)
    out = "accepted"
except sp.CorruptCheckpointError as e:
    out = "refused: " + str(e)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024, out)
"""


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("bomb") / "bomb")
    _bomb(p, GIB)
    return p


@pytest.mark.parametrize("how", ["getitem", "load", "load_file"])
def test_a_1gib_object_claim_is_refused_without_the_memory(bomb, how) -> None:
    """A ~20 KB file whose object entry claims (and really decompresses to) 1 GiB: refused
    with an error naming the key and the bound, while the reading process's peak memory grows
    by far less than the bound (before: ~2 GiB, the value decompressed and copied, then
    refused)."""
    p = bomb
    d = os.path.dirname(p)
    assert sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) < 200_000
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, p, how],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
    assert out.returncode == 0, out.stderr
    grew_mib, verdict = out.stdout.strip().split(" ", 1)
    assert verdict.startswith("refused: "), verdict
    assert '"obj"' in verdict and str(MAX_OBJECT_BYTES) in verdict, verdict
    assert int(grew_mib) < 32, f"peak RSS grew by {grew_mib} MiB for a refused 1 GiB claim"


def test_objects_within_the_bound_still_read(tmp_path) -> None:
    """The bound refuses claims above it only: a 3 MiB object (compressed, several chunks)
    reads back."""
    p = str(tmp_path / "ck")
    big = {"blob": base64.b64encode(bytes(range(256)) * 9000).decode(), "n": {1, 2}}
    sp.save_file({"o": big}, p)
    assert sp.open(p).info("o").raw_bytes > 2 << 20
    assert sp.load_file(p)["o"] == big
