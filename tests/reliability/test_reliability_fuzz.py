"""Python-level fuzzing (issue 7, part 4): hypothesis mutates the files of real checkpoints
(byte flips, interesting integers over header/record fields, truncation, extension), half of
the time with every index crc recomputed so the mutation reaches the semantic checks, and
``sp.open`` / ``sp.load_file`` / ``verify`` must either return exactly the saved values or raise
a ``CheckpointError`` (never another exception, never a crash, never wrong data: a payload is
only returned when its crc32c matches).

``SHARDPOINT_FUZZ_EXAMPLES`` sets the examples per target (default 300). The number of
executions is printed with ``-s`` and recorded in docs/RELIABILITY.md.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_reader as rr
import shardpoint as sp
from reference_reader import crc32c
from reliability_helpers.craft import _seal

# an exhaustive sweep: `make test` runs it, `make test-quick` leaves it out
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SHARDPOINT_FUZZ_EXAMPLES", "300"))
EXECS: Counter[str] = Counter()
INTERESTING = [0, 1, 63, 64, 4095, 4096, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**63, 2**64 - 1]

VALUES = {
    "a/raw": np.arange(200, dtype=np.int32),
    "a/smooth": (np.sin(np.arange(3000, dtype=np.float32) * 0.01)).reshape(30, 100),
    "b/text": "hello",
    "b/json": {"k": [1, 2, 3]},
    "b/zeros": np.zeros((64, 64), np.float16),
}


@pytest.fixture(scope="module")
def pristine() -> dict[str, bytes]:
    """name -> bytes of every file of a small two-shard checkpoint."""
    d = tempfile.mkdtemp()
    try:
        sp.save_file(VALUES, d + "/ck", shards=2, chunk_bytes=4096)
        out = {}
        for n in os.listdir(d):
            with open(os.path.join(d, n), "rb") as f:
                out[n] = f.read()
        return out
    finally:
        shutil.rmtree(d)


def reseal(b: bytearray) -> None:
    """Recompute shard/block/metadata crcs (when the layout is in bounds) and the header crc."""
    if len(b) < 144:
        return
    try:
        n, sc = struct.unpack_from("<QI", b, 24)
        so, bo, eo, ko, kl, ao, al, mo, ml = struct.unpack_from("<9Q", b, 40)
        nb = -(-n // 64)
        if max(so + 64 * sc, bo + 24 * nb, eo + 40 * n, ko + kl, ao + al, mo + ml) > len(b):
            raise ValueError
        for k in range(nb):
            at = bo + 24 * k
            klo, alo = struct.unpack_from("<QQ", b, at)
            khi, ahi = struct.unpack_from("<QQ", b, at + 24) if k + 1 < nb else (kl, al)
            lo, hi = 64 * k, min(n, 64 * (k + 1))
            data = bytes(b[eo + 40 * lo : eo + 40 * hi] + b[ko + klo : ko + khi])
            data += bytes(b[ao + alo : ao + ahi])
            struct.pack_into("<I", b, at + 16, crc32c(data))
        struct.pack_into(
            "<III",
            b,
            112,
            crc32c(bytes(b[so : so + 64 * sc])),
            crc32c(bytes(b[bo : bo + 24 * nb])),
            crc32c(bytes(b[mo : mo + ml])),
        )
    except (ValueError, struct.error):
        pass
    _seal(b)


@st.composite
def mutations(draw: st.DrawFn, size: int) -> list[tuple[str, int, int]]:
    ops = st.one_of(
        st.tuples(st.just("flip"), st.integers(0, size - 1), st.integers(0, 7)),
        st.tuples(st.just("int"), st.integers(0, size // 8 - 1), st.sampled_from(INTERESTING)),
        st.tuples(st.just("set"), st.integers(0, size - 1), st.integers(0, 255)),
        st.tuples(st.just("truncate"), st.integers(0, size - 1), st.just(0)),
        st.tuples(st.just("extend"), st.integers(1, 64), st.just(0)),
    )
    return draw(st.lists(ops, min_size=1, max_size=4))


def apply(data: bytes, ops: list[tuple[str, int, int]]) -> bytearray:
    b = bytearray(data)
    for op, a, v in ops:
        if not b:
            break
        if op == "flip":
            b[a % len(b)] ^= 1 << v
        elif op == "int":
            at = (a * 8) % max(8, len(b) - 8)
            b[at : at + 8] = struct.pack("<Q", v)[: len(b[at : at + 8])]
        elif op == "set":
            b[a % len(b)] = v
        elif op == "truncate":
            del b[a % len(b) :]
        else:
            b += bytes(a)
    return b


def check(d: str, target: str, resealed: bool) -> str:
    """Read everything; the verdict is "ok" or "refused" (a CheckpointError); anything else
    fails the test. When accepted, the values must be the saved ones; except that a resealed
    mutation can make a *different valid* checkpoint (a renamed key, a changed shape): then
    what the library returns must equal what the independent reference reader returns."""
    EXECS[target] += 1
    try:
        got = sp.load_file(d + "/ck")
        with sp.open(d + "/ck") as r:
            _ = r.metadata
            r.verify()
    except sp.CheckpointError:
        return "refused"
    if resealed:
        try:
            ref, _ = rr.load(d + "/ck")
        except rr.FormatError:
            return "ok"  # the reference reader is stricter (zero padding, gaps): no oracle
        assert set(got) == set(ref), (sorted(got), sorted(ref))
        for k, v in ref.items():
            if isinstance(v, np.ndarray):
                assert np.array_equal(got[k], v) and got[k].shape == v.shape, k
            else:
                assert got[k] == v, k
        return "ok"
    assert set(got) == set(VALUES)
    for k, v in VALUES.items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(got[k], v), f"{k}: silently wrong data"
        else:
            assert got[k] == v, f"{k}: silently wrong data"
    return "ok"


def _fuzz_file(pristine: dict[str, bytes], which: str, ops, resealed: bool) -> None:
    name = next(n for n in pristine if n.endswith(which))
    with tempfile.TemporaryDirectory() as d:
        for n, data in pristine.items():
            with open(os.path.join(d, n), "wb") as f:
                f.write(data)
        b = apply(pristine[name], ops)
        if resealed and which == ".index":
            reseal(b)
        with open(os.path.join(d, name), "wb") as f:
            f.write(b)
        EXECS[f"{which}:{check(d, which, resealed and which == '.index')}"] += 1


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), resealed=st.booleans())
def _fuzz_index_examples(pristine, data, resealed: bool) -> None:
    size = len(next(v for n, v in pristine.items() if n.endswith(".index")))
    _fuzz_file(pristine, ".index", data.draw(mutations(size)), resealed)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def _fuzz_shard_examples(pristine, data) -> None:
    name = sorted(n for n in pristine if ".data-" in n)[0]
    size = len(pristine[name])
    _fuzz_file(pristine, name[-len(".data-00000-of-00002") :], data.draw(mutations(size)), False)


# Each test counts its own executions (no state shared between tests: under pytest-xdist two
# tests of this file may run in different processes). The counts print with `-s`.
def test_fuzz_index(pristine) -> None:
    EXECS.clear()
    _fuzz_index_examples(pristine)
    print(f"\npython fuzz executions (.index): {dict(EXECS)}")
    assert EXECS[".index"] >= EXAMPLES
    # mutations of both kinds were seen: some are refused, some (padding, unused bytes) harmless
    assert EXECS[".index:refused"] > 0


def test_fuzz_shard(pristine) -> None:
    EXECS.clear()
    _fuzz_shard_examples(pristine)
    print(f"\npython fuzz executions (shard): {dict(EXECS)}")
    shard = ".data-00000-of-00002"
    assert EXECS[shard] >= EXAMPLES
    assert EXECS[f"{shard}:refused"] > 0
