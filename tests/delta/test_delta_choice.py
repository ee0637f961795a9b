"""The per-tensor choice of a delta from the XOR's statistics (shardpoint.delta.choice): the
estimate against the real encoder's stored bytes, the bands, and the guarantees the choice
keeps (a dense change never costs more than a full save; a zero-rich value is measured)."""

from __future__ import annotations

import glob
import os

import ml_dtypes
import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint import _core
from shardpoint.delta import choice
from shardpoint.delta.bits import byte_view, xor_bytes
from shardpoint.storage.values import encode as encode_value


def _files(prefix: str) -> int:
    return sum(os.path.getsize(f) for f in glob.glob(prefix + ".*"))


def _sparse_xor(n: int, itemsize: int, fraction: float, seed: int = 0) -> np.ndarray:
    """XOR bytes of ``n`` elements: ``fraction`` of them with random nonzero low bytes."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, itemsize), np.uint8)
    hit = rng.random(n) < fraction
    x[hit, 0] = rng.integers(1, 256, int(hit.sum()))
    if itemsize > 1:
        x[hit, 1] = rng.integers(0, 256, int(hit.sum()))
    return x.reshape(-1)


@pytest.mark.parametrize("fraction", [1e-3, 0.01, 0.05, 0.2, 0.6])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_estimate_bounds_the_real_stored_bytes(
    tmp_path: os.PathLike[str], fraction: float, dtype: type
) -> None:
    """The estimate is an upper bound of what zstd-bytegroup stores (within 10%) and not
    wildly above it (what keeps sparse changes out of the measured band)."""
    itemsize = np.dtype(dtype).itemsize
    x = _sparse_xor(1 << 19, itemsize, fraction)
    k, est = choice.estimate_xor_bytes(x, itemsize)
    assert k > 0
    p = os.path.join(tmp_path, "x")
    sp.save_file({"x": x.view(dtype)}, p, compression=choice.XOR_CODEC, level=choice.XOR_LEVEL)
    with sp.open(p) as r:
        real = r.info("x").stored_bytes
    assert real <= 1.1 * est, (real, est)
    assert est <= 3 * real + 4096, (real, est)


def test_same_is_found_without_a_payload() -> None:
    a = np.arange(1 << 16, dtype=np.float32)
    pairs = {"t": (a.dtype, byte_view(a), byte_view(a.copy()))}
    (c,) = choice.choose(pairs, "zstd", None).values()
    assert c.mode == "same" and c.crc == c.base_crc


def test_bands_without_measuring() -> None:
    """Sparse changes of a dense float value are ``xor`` and random ones ``full`` from the
    statistics alone (no hint: the weight-sync case)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(1 << 18).astype(np.float32)
    sparse = a.copy()
    sparse[::100] += 1e-3
    dense = rng.integers(0, 2**32, a.size, dtype=np.uint32).view(np.float32)
    for new, want in ((sparse, "xor"), (dense, "full")):
        x = xor_bytes(byte_view(new), byte_view(a))
        _, est = choice.estimate_xor_bytes(x, 4)
        (s,) = choice.stats({"t": (new.dtype, byte_view(new), byte_view(a))}).values()
        assert choice._band(est, x.size, s.nonzero_fraction, None) == want


def test_zero_rich_value_is_measured_and_stored_whole() -> None:
    """A mostly-zero value (a regular pattern: compresses to next to nothing) against a base
    with scattered nonzeros: the XOR's estimate is small, but the whole value is smaller
    still; without a hint the choice measures and stores it whole."""
    rng = np.random.default_rng(4)
    a = np.zeros(1 << 18, np.float32)
    a[rng.random(a.size) < 1 / 64] = 1.5
    b = np.zeros_like(a)
    b[::64] = 1.0
    x = xor_bytes(byte_view(b), byte_view(a))
    _, est = choice.estimate_xor_bytes(x, 4)
    assert est < x.size / 4
    (s,) = choice.stats({"t": (b.dtype, byte_view(b), byte_view(a))}).values()
    assert s.nonzero_fraction < 0.05
    assert choice._band(est, x.size, s.nonzero_fraction, None) == "close"
    got = choice.choose({"t": (b.dtype, byte_view(b), byte_view(a))}, choice.XOR_CODEC, 1)
    assert got["t"].mode == "full"
    blob = spd.encode({"t": a}, {"t": b})
    assert blob is not None
    target = {"t": a.copy()}
    assert spd.apply(blob, target)["full"] == 1
    assert target["t"].tobytes() == b.tobytes()


def test_dense_change_never_costs_more_than_a_full_save(tmp_path: os.PathLike[str]) -> None:
    rng = np.random.default_rng(2)
    old = {f"w{i}": rng.standard_normal((512, 256)).astype(ml_dtypes.bfloat16) for i in range(4)}
    new = {k: (v.astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16) for k, v in old.items()}
    base, full, delta = (os.path.join(tmp_path, s) for s in ("base", "full", "delta"))
    sp.save_file(old, base)
    sp.save_file(new, full)
    sp.save_file(new, delta, base=base, delta=True)
    assert _files(delta) <= 1.01 * _files(full)
    assert all(sp.load_file(delta)[k].tobytes() == new[k].tobytes() for k in new)


def test_sparse_change_is_small(tmp_path: os.PathLike[str]) -> None:
    """Many tensors, 1% of elements moved: every one ``xor``, the checkpoint a few % of raw;
    the statistics are the XOR's, counted here with numpy."""
    rng = np.random.default_rng(3)
    old = {f"w{i}": rng.standard_normal(1 << 16).astype(ml_dtypes.bfloat16) for i in range(16)}
    new = {k: v.copy() for k, v in old.items()}
    for v in new.values():
        v[rng.random(v.size) < 0.01] += ml_dtypes.bfloat16(0.5)
    pairs = {k: (new[k].dtype, byte_view(new[k]), byte_view(old[k])) for k in new}
    one = choice.choose(pairs, "zstd", None)
    assert {c.mode for c in one.values()} == {"xor"}
    for k, s in choice.stats(pairs).items():
        e = xor_bytes(pairs[k][1], pairs[k][2]).view(np.uint16)
        assert s.changed == int(np.count_nonzero(e))
        assert s.planes == [s.changed, int(np.count_nonzero(e >= 256))]
        assert s.nonzero_fraction == np.count_nonzero(new[k].view(np.uint16)) / e.size
    base, delta = os.path.join(tmp_path, "base"), os.path.join(tmp_path, "delta")
    sp.save_file(old, base)
    sp.save_file(new, delta, base=base, delta=True)
    raw = sum(v.nbytes for v in new.values())
    assert _files(delta) < 0.06 * raw


def _nudged(a: np.ndarray, fraction: float, seed: int, random_low: bool) -> np.ndarray:
    """``a`` (bf16) with ``fraction`` of its elements changed in the low mantissa byte: by one
    or two units in the last place (an optimizer step's rounding), or to a random byte."""
    rng = np.random.default_rng(seed)
    bits = a.view(np.uint16).copy()
    hit = rng.random(bits.size) < fraction
    if random_low:
        low = rng.integers(0, 256, bits.size, dtype=np.uint16)
        bits[hit] = (bits[hit] & 0xFF00) | low[hit]
    else:
        bits[hit] ^= (1 + (rng.random(int(hit.sum())) < 0.3)).astype(np.uint16)  # XOR 1 or 2
    return bits.view(ml_dtypes.bfloat16)


def test_close_band_step_is_settled_on_small_xor_windows() -> None:
    """A step that nudges a quarter of a weight's elements is in the close band by the
    estimate (which models random changed bytes), yet its XOR codes far smaller: the quick
    XOR-only windows make it ``xor`` without measuring the whole value, and the choice holds
    on the whole value's real sizes. Random low bytes at half the elements stay measured."""
    a = np.random.default_rng(5).standard_normal(1 << 19).astype(ml_dtypes.bfloat16)
    step = _nudged(a, 0.25, 6, random_low=False)
    noisy = _nudged(a, 0.5, 7, random_low=True)
    pairs = {
        k: (a.dtype, byte_view(v), byte_view(a)) for k, v in (("step", step), ("noisy", noisy))
    }
    stats = choice.stats(pairs)
    for k, (_, nb, _) in pairs.items():
        est = choice._estimate(stats[k].planes, nb.size)
        assert choice._band(est, nb.size, stats[k].nonzero_fraction, None) == "close", k
        assert est <= choice._QUICK_UP_TO * nb.size, k
    assert choice._quick_xor(pairs) == ["step"]
    got = choice.choose(pairs, choice.XOR_CODEC, choice.XOR_LEVEL)
    assert got["step"].mode == "xor"
    assert got["noisy"].mode == choice._measure({"noisy": pairs["noisy"]}, "zstd", None)["noisy"]
    # the quick choice is right on the whole value: its XOR stores well under the value
    whole = _core.encoded_sizes(
        [encode_value("w", step)], codec="zstd-bytegroup", level=1,
        chunk_bytes=int(_core.DEFAULT_CHUNK_BYTES), xor_bases=[None],
    )[0]  # fmt: skip
    xor = _core.encoded_sizes(
        [encode_value("w", step)], codec="zstd-bytegroup", level=1,
        chunk_bytes=int(_core.DEFAULT_CHUNK_BYTES), xor_bases=[byte_view(a)],
    )[0]  # fmt: skip
    assert xor < whole / 2, (xor, whole)
