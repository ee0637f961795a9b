"""The Python file API (save_file, load_file, open/Reader, Writer, merge, exists, remove): property
round trips over every dtype, layout and compression mode, the Writer's commit/abort protocol
and multi-writer merges (the error cases: test_files_errors.py)."""

from __future__ import annotations

import math
import os
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_reader as rr
import shardpoint as sp
import shardpoint.testing.strategies as sps
from shardpoint.dtypes import format_name, numpy_dtype
from shardpoint.testing import assert_identical
from shardpoint.testing._bits import NAMES

# every dtype of the format (FORMAT.md §4), from the shardpoint.testing kit
DTYPES = list(NAMES)
COMPRESSIONS = ["none", "zstd", "zstd-plain"]
SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def np_dtype(name: str) -> np.dtype:
    return numpy_dtype(name)


def assert_array_same(got: object, want: np.ndarray, key: str = "") -> None:
    """Bit for bit (shardpoint.testing.assert_identical), and as a reader hands arrays out:
    C-contiguous, native byte order."""
    assert_identical(np.asarray(want), got)
    assert isinstance(got, np.ndarray) and got.flags.c_contiguous, key
    assert got.dtype.byteorder in "<=|", key


def new_prefix(tmp_path) -> str:
    return os.path.join(tempfile.mkdtemp(dir=tmp_path), "ck")


def files_of(prefix: str) -> list[str]:
    d, base = os.path.split(prefix)
    return sorted(f for f in os.listdir(d) if f.startswith(base + "."))


# ---- strategies ------------------------------------------------------------------------------

KEYS = sps.keys()  # dots, slashes, near-collisions, unicode
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
    max_leaves=10,
)


def arrays() -> st.SearchStrategy[np.ndarray]:
    """Small arrays of every dtype with arbitrary bit patterns, in C, Fortran, strided,
    reversed, broadcast and big-endian layouts; ndim 0..3 including empty dimensions."""
    return sps.tensors(shape=sps.shapes(max_dims=3, max_side=5))


@st.composite
def big_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays large enough to be chunked and compressed (smooth values, some noise)."""
    name = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1100, 20000))
    rng = np.random.default_rng(seed)
    dt = np_dtype(name)
    if name == "bool":
        a = rng.random(n) < 0.05
    elif dt.kind in "iu":
        a = np.cumsum(rng.integers(-3, 4, n)).astype(dt)
    elif name.startswith("complex"):
        a = (rng.standard_normal(n) * 0.01 + 1j).astype(dt)
    else:
        a = (rng.standard_normal(n) * 0.01).astype(np.float32).astype(dt)
    if draw(st.booleans()):  # an incompressible stretch: mixed raw/compressed chunks
        lo = draw(st.integers(0, n - 1))
        hi = min(n, lo + 3000)
        if name == "bool":
            a[lo:hi] = rng.random(hi - lo) < 0.5
        else:
            a[lo:hi] = np.frombuffer(rng.bytes((hi - lo) * dt.itemsize), dtype=dt)
    cols = draw(st.sampled_from([1, 3, 7]))
    return a[: n - n % cols].reshape(-1, cols) if cols > 1 else a


# ---- round trips -----------------------------------------------------------------------------


@SETTINGS
@given(
    values=st.dictionaries(KEYS, arrays(), min_size=1, max_size=6),
    compression=st.sampled_from(COMPRESSIONS),
    shards=st.integers(1, 3),
    metadata=st.dictionaries(st.text(max_size=6), JSON, max_size=3),
)
def test_round_trip_small(tmp_path, values, compression, shards, metadata) -> None:
    p = new_prefix(tmp_path)
    sp.save_file(
        values, p, compression=compression, shards=shards, metadata=metadata, durable=False
    )
    got = sp.load_file(p)
    assert sorted(got) == sorted(values)
    for k, v in values.items():
        assert_array_same(got[k], v, k)
    with sp.open(p) as r:
        assert r.metadata == metadata
        assert r.keys() == sorted(values, key=lambda k: k.encode())
        assert len(r) == len(values)
        for k, v in values.items():
            assert k in r
            assert_array_same(r[k], v, k)
            assert_array_same(r.get(k, verify=True), v, k)
            info = r.info(k)
            assert (
                info.shape == v.shape
                and info.dtype == format_name(v.dtype)
                and info.kind == "tensor"
            )
        r.verify()


@settings(SETTINGS, max_examples=20)
@given(
    values=st.lists(big_arrays(), min_size=1, max_size=3),
    compression=st.sampled_from(COMPRESSIONS),
    chunk_bytes=st.sampled_from([4096, 8192, 1 << 20]),
)
def test_round_trip_chunked(tmp_path, values, compression, chunk_bytes) -> None:
    p = new_prefix(tmp_path)
    d = {f"t{i}": v for i, v in enumerate(values)}
    sp.save_file(d, p, compression=compression, chunk_bytes=chunk_bytes, durable=False)
    got = sp.load_file(p)
    for k, v in d.items():
        assert_array_same(got[k], v, k)
    with sp.open(p) as r:
        r.verify()
        for k, v in d.items():
            info = r.info(k)
            if compression == "none":
                assert info.codec == "none"
            if info.codec != "none":
                assert info.chunks == math.ceil(info.raw_bytes / chunk_bytes)
            rows = v.shape[0]
            lo, hi = rows // 3, rows // 3 + rows // 4 + 1
            assert_array_same(r.slice(k, lo, hi), v[lo:hi], k)


@SETTINGS
@given(
    values=st.dictionaries(
        KEYS,
        st.one_of(
            st.binary(max_size=40),
            st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
            st.integers(-(2**200), 2**200),
            st.floats(allow_nan=False),
            st.booleans(),
            st.none(),
            st.lists(JSON, max_size=3),
            st.dictionaries(st.text(max_size=4), JSON, max_size=3),
        ),
        min_size=1,
        max_size=6,
    ),
    compression=st.sampled_from(COMPRESSIONS),
)
def test_round_trip_typed_values(tmp_path, values, compression) -> None:
    p = new_prefix(tmp_path)
    sp.save_file(values, p, compression=compression, durable=False)
    got = sp.load_file(p)
    assert_identical(values, got)  # types too: bytes, big ints, float bits, nesting
    ref, _ = rr.load(p)
    assert ref == values


def test_special_values(tmp_path) -> None:
    p = str(tmp_path / "ck")
    vals = {
        "nan": float("nan"),
        "inf": float("inf"),
        "-0.0": -0.0,
        "tuple": (1, (2, 3)),
        "np-scalar-f32": np.float32(1.5),
        "np-scalar-bool": np.bool_(False),
        "0-d": np.array(7, dtype=np.uint16),
        "empty": np.zeros((2, 0, 3), dtype=np.complex128),
        "bytearray": bytearray(b"xy"),
        "memoryview": memoryview(b"mv"),
    }
    sp.save_file(vals, p, durable=False)
    got = sp.load_file(p)
    assert math.isnan(got["nan"]) and got["inf"] == math.inf
    assert math.copysign(1, got["-0.0"]) == -1
    assert got["tuple"] == (1, (2, 3)) and type(got["tuple"][1]) is tuple  # FORMAT.md §6.1
    for k in ("0-d", "empty"):
        assert_array_same(got[k], np.asarray(vals[k]), k)
    for k in ("np-scalar-f32", "np-scalar-bool"):  # numpy scalars stay scalars (FORMAT.md §6.1)
        assert type(got[k]) is type(vals[k]) and got[k] == vals[k], k
    assert got["bytearray"] == bytearray(b"xy") and type(got["bytearray"]) is bytearray
    assert got["memoryview"] == b"mv"  # a view of bytes is stored as the bytes


def test_huge_int_round_trips(tmp_path) -> None:
    """FORMAT.md §6: int values are decimal ASCII of arbitrary precision (beyond Python's default
    4300-digit str() limit)."""
    p = str(tmp_path / "ck")
    v = -(7**6000)
    sp.save_file({"n": v}, p, durable=False)
    assert sp.load_file(p)["n"] == v


@settings(SETTINGS, max_examples=40)
@given(start=st.integers(-400, 400), stop=st.integers(-400, 400))
def test_slice_matches_numpy(tmp_path_factory, start, stop) -> None:
    for p, a in _slice_fixture(tmp_path_factory):
        with sp.open(p) as r:
            for k in ("a", "b"):
                assert_array_same(r.slice(k, start, stop), a[k][start:stop], k)


_SLICE_CACHE: list = []


def _slice_fixture(factory) -> list:
    if not _SLICE_CACHE:
        rng = np.random.default_rng(9)
        a = {
            "a": (rng.standard_normal((333, 37)) * 0.01).astype(
                np.float32
            ),  # 11 chunks, uneven rows
            "b": np.cumsum(rng.integers(-2, 3, 9000)).astype(">i8"),
        }
        for comp in COMPRESSIONS:
            p = str(factory.mktemp("slice") / comp)
            sp.save_file(a, p, compression=comp, chunk_bytes=4096, durable=False)
            with sp.open(p) as r:
                assert (r.info("a").codec == "none") == (comp == "none")
            _SLICE_CACHE.append((p, a))
    return _SLICE_CACHE


def test_slice_refuses_scalars_and_typed(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"s": np.array(1.0), "t": "text"}, p, durable=False)
    with sp.open(p) as r:
        for k in ("s", "t"):
            with pytest.raises(sp.InvalidArgumentError, match=repr(k)):
                r.slice(k, 0, 1)
        with pytest.raises(KeyError):
            r.slice("missing", 0, 1)


@SETTINGS
@given(
    keys=st.sets(
        st.text(alphabet="ab/é\U0001f600", min_size=1, max_size=6), min_size=1, max_size=25
    ),
    prefix=st.text(alphabet="ab/é\U0001f600", max_size=3),
)
def test_prefix(tmp_path, keys, prefix) -> None:
    p = new_prefix(tmp_path)
    sp.save_file({k: i for i, k in enumerate(sorted(keys))}, p, durable=False)
    with sp.open(p) as r:
        want = sorted((k for k in keys if k.startswith(prefix)), key=lambda k: k.encode())
        assert r.prefix(prefix) == want


def test_prefix_many_blocks(tmp_path) -> None:
    p = str(tmp_path / "ck")
    keys = [f"net/l{i:03d}/{w}" for i in range(50) for w in ("bias", "kernel")] + ["opt/step", "z"]
    sp.save_file({k: np.arange(3) for k in keys}, p, durable=False)
    with sp.open(p) as r:
        assert r.prefix("net/l01") == sorted(k for k in keys if k.startswith("net/l01"))
        assert r.prefix("opt/") == ["opt/step"]
        assert r.prefix("q") == [] and r.prefix("") == sorted(keys)
        with pytest.raises(sp.InvalidKeyError):
            r.prefix(3)  # type: ignore[arg-type]


# ---- reader semantics ------------------------------------------------------------------------


def test_zero_copy_arrays_are_private_and_outlive_the_reader(tmp_path) -> None:
    p = str(tmp_path / "ck")
    a = np.arange(5000, dtype=np.int32)
    sp.save_file({"a": a, "z": a.astype(np.float64)}, p, compression="none", durable=False)
    r = sp.open(p)
    x = r["a"]
    x[0] = -1  # writable, copy-on-write
    r.close()
    assert x[0] == -1 and x[1] == 1
    with pytest.raises(sp.InvalidArgumentError):
        r["a"]
    assert_array_same(sp.load_file(p)["a"], a)  # the file did not change
    sp.remove(p)
    assert x[4999] == 4999


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_overwrite_while_reader_open(tmp_path, compression: str) -> None:
    p = str(tmp_path / "ck")
    rng = np.random.default_rng(1)
    old = {"w": (rng.standard_normal((200, 100)) * 0.01).astype(np.float32), "step": 1}
    new = {"w": old["w"] * 2, "step": 2, "extra": b"x"}
    sp.save_file(old, p, compression=compression, durable=False, chunk_bytes=4096)
    r = sp.open(p)
    before = r["w"]
    for i in range(3):  # the 2nd and 3rd saves also clean up shards this reader has open
        sp.save_file({**new, "step": 2 + i}, p, compression=compression, durable=False)
        after = r["w"]
        assert_array_same(after, old["w"])
        assert_array_same(before, old["w"])
        assert r["step"] == 1 and "extra" not in r
        assert_array_same(r.slice("w", 10, 20), old["w"][10:20])
        r.verify()
    r.close()
    got = sp.load_file(p)
    assert_array_same(got["w"], new["w"])
    assert got["step"] == 4


def test_exists_and_remove(tmp_path) -> None:
    p = str(tmp_path / "ck")
    assert not sp.exists(p)
    sp.save_file({"a": np.ones(3)}, p, shards=2, durable=False)
    assert sp.exists(p) and len(files_of(p)) == 3
    sp.remove(p)
    assert not sp.exists(p) and files_of(p) == []
    with pytest.raises(sp.NotFoundError, match="ck.index"):
        sp.remove(p)


# ---- Writer ----------------------------------------------------------------------------------


def test_writer_context_manager_commits(tmp_path) -> None:
    p = str(tmp_path / "ck")
    with sp.Writer(p, durable=False, metadata={"m": 1}, chunk_bytes=4096) as w:
        w.add("a", np.arange(10000, dtype=np.float32))
        w["b"] = "value"
        assert not sp.exists(p)  # nothing visible before the commit
    assert files_of(p) == [os.path.basename(p) + s for s in (".data-00000-of-00001", ".index")]
    got = sp.load_file(p)
    assert_array_same(got["a"], np.arange(10000, dtype=np.float32))
    assert got["b"] == "value"
    with sp.open(p) as r:
        assert r.metadata == {"m": 1}
    with pytest.raises(sp.InvalidArgumentError):
        w.add("c", 1)
    with pytest.raises(sp.InvalidArgumentError):
        w.commit()


def test_writer_abort_on_exception_keeps_previous(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"a": np.arange(4), "old": 1}, p, durable=False)
    before = files_of(p)
    with pytest.raises(RuntimeError, match="boom"):
        with sp.Writer(p, durable=False, shards=2) as w:
            w.add("a", np.zeros(100000))
            w.add("new", 2)
            raise RuntimeError("boom")
    assert files_of(p) == before  # no temp files, previous shards untouched
    got = sp.load_file(p)
    assert_array_same(got["a"], np.arange(4)) and got["old"] == 1 and "new" not in got
    # an explicit abort, and an abort after a failed add
    w = sp.Writer(p, durable=False)
    w.add("x", 1)
    with pytest.raises(sp.UnsupportedDTypeError):
        w.add("bad", np.array(["s"]))
    w.abort()
    w.abort()  # idempotent
    assert files_of(p) == before


def test_writer_threads_add_concurrently(tmp_path) -> None:
    p = str(tmp_path / "ck")
    rng = np.random.default_rng(3)
    vals = {f"t{i}": (rng.standard_normal(20000) * 0.1).astype(np.float32) for i in range(16)}
    w = sp.Writer(p, shards=3, durable=False)
    errors: list[BaseException] = []

    def add(keys: list[str]) -> None:
        try:
            for k in keys:
                w.add(k, vals[k])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=add, args=(list(vals)[i::4],)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    w.commit()
    got = sp.load_file(p)
    for k, v in vals.items():
        assert_array_same(got[k], v, k)


def test_multi_writer_merge(tmp_path) -> None:
    p = str(tmp_path / "ck")
    world = 3
    want: dict = {}
    for rank in range(world):
        with sp.Writer(p, rank=rank, world_size=world, durable=False, metadata={"r": rank}) as w:
            for i in range(5):
                k = f"rank{rank}/v{i}"
                want[k] = np.full((i + 1, 2), rank * 10 + i, dtype=np.int16)
                w.add(k, want[k])
        assert not sp.exists(p)
    sp.merge(p, world, durable=False)
    got = sp.load_file(p)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert_array_same(got[k], v, k)
    with sp.open(p) as r:
        assert r.metadata == {"r": 0}
    assert not any(".part-" in f for f in files_of(p))


def test_merge_duplicate_key_across_writers(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"keep": 1}, p, durable=False)
    for rank in range(2):
        with sp.Writer(p, rank=rank, world_size=2, durable=False) as w:
            w.add(f"own{rank}", rank)
            w.add("shared/key", rank)
    with pytest.raises(sp.DuplicateKeyError, match=r"shared/key.*rank 0.*rank 1"):
        sp.merge(p, 2, durable=False)
    assert sp.load_file(p) == {"keep": 1}  # the previous checkpoint is still the one at P


def test_merge_missing_partial(tmp_path) -> None:
    p = str(tmp_path / "ck")
    with sp.Writer(p, rank=0, world_size=2, durable=False) as w:
        w.add("a", 1)
    with pytest.raises(sp.NotFoundError, match=r"index\.part-00001-of-00002"):
        sp.merge(p, 2, durable=False)
    assert not sp.exists(p)


def test_duplicate_key_in_one_writer(tmp_path) -> None:
    p = str(tmp_path / "ck")
    w = sp.Writer(p, durable=False)
    w.add("k", np.arange(3))
    with pytest.raises(sp.DuplicateKeyError, match='"k"'):
        w.add("k", np.arange(4))
    w.commit()
    assert_array_same(sp.load_file(p)["k"], np.arange(3))
