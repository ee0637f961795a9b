"""The Rust kernels of deltas (``_core.xor_stats``, the writer's XOR items, ``_core.xor_into``)
through ``encode``/``apply`` and the delta reader, on every stored dtype (bfloat16, float8,
packed float4, complex, bool...), NaN payloads, odd and empty lengths; and hostile inputs: a
truncated payload, a wrong base. Bit patterns only: ``apply(encode(old, new), old) == new``
byte for byte."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint import _core
from shardpoint.delta import choice
from shardpoint.delta.bits import byte_view, xor_bytes
from shardpoint.errors import (
    BaseMismatchError,
    CheckpointError,
    ChecksumMismatchError,
    InvalidArgumentError,
)
from shardpoint.storage.dtypes import numpy_dtype

DTYPES = [numpy_dtype(n) for n in _core.dtype_names()]


def _pair(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(old, new) of one dtype: random bytes (NaN payloads, -0.0, any float8/float4 code)
    and ``new`` with a few bytes flipped (or none, or all)."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(0, 3000))
    raw = np.frombuffer(
        draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize)), np.uint8
    )
    if dtype == np.bool_:
        raw = raw & 1  # numpy bools are 0/1 bytes
    old = raw.copy()
    new = raw.copy()
    for at in draw(st.lists(st.integers(0, max(0, raw.size - 1)), max_size=20 if raw.size else 0)):
        new[at] ^= 1 if dtype == np.bool_ else draw(st.integers(1, 255))
    return old.view(dtype), new.view(dtype)


pairs = st.composite(_pair)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pairs(), min_size=1, max_size=4))
def test_encode_apply_round_trip_bit_exact(
    tmp_path_factory: pytest.TempPathFactory, vals: list
) -> None:
    old = {f"k{i}": o for i, (o, _) in enumerate(vals)}
    new = {f"k{i}": n for i, (_, n) in enumerate(vals)}
    blob = spd.encode(old, new)
    assert blob is not None
    target = {k: v.copy() for k, v in old.items()}
    spd.apply(blob, target)
    assert all(target[k].tobytes() == new[k].tobytes() for k in new)
    # the checkpoint path: the same kernels through save_file(delta=True) and the reader
    d = str(tmp_path_factory.mktemp("k"))
    sp.save_file(old, os.path.join(d, "b"), durable=False)
    sp.save_file(new, os.path.join(d, "d"), base=os.path.join(d, "b"), delta=True, durable=False)
    got = sp.load_file(os.path.join(d, "d"))
    assert all(got[k].tobytes() == new[k].tobytes() for k in new)


@settings(max_examples=60, deadline=None)
@given(pairs())
def test_statistics_match_numpy(pair: tuple[np.ndarray, np.ndarray]) -> None:
    old, new = pair
    nb, ob = byte_view(new), byte_view(old)
    (s,) = choice.stats({"t": (new.dtype, nb, ob)}).values()
    w = choice._width(nb.size, new.dtype.itemsize)
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[w]
    e = xor_bytes(nb, ob).view(u)
    assert s.changed == int(np.count_nonzero(e))
    assert s.planes == [
        int(np.count_nonzero(e >= u(1) << u(8 * j))) if j else s.changed for j in range(w)
    ]
    assert s.crc == _core.crc32c(nb) and s.base_crc == _core.crc32c(ob)
    out = np.full(nb.size, 7, np.uint8)
    _core.xor_stats([nb], [ob], [w], [out])
    assert out.tobytes() == xor_bytes(nb, ob).tobytes()


def test_lengths_not_a_multiple_of_the_width_are_refused() -> None:
    a = np.zeros(6, np.uint8)
    with pytest.raises(InvalidArgumentError, match="whole number"):
        _core.xor_stats([a], [a], [4])
    with pytest.raises(InvalidArgumentError, match="base bytes"):
        _core.xor_stats([a], [a[:4]], [1])


def _state(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    old = {"w": rng.standard_normal((256, 256)).astype(np.float32), "b": np.ones(7, np.float16)}
    new = {k: v.copy() for k, v in old.items()}
    new["w"][::9] += 1e-3
    return old, new


def test_truncated_payload_raises_and_leaves_the_target() -> None:
    old, new = _state(0)
    blob = spd.encode(old, new)
    assert blob is not None
    for cut in (len(blob) // 2, len(blob) - 1, 100):
        target = {k: v.copy() for k, v in old.items()}
        with pytest.raises(CheckpointError):
            spd.apply(blob[:cut], target)
        assert all(target[k].tobytes() == old[k].tobytes() for k in old)


def test_wrong_base_raises_before_writing_and_a_damaged_payload_restores() -> None:
    old, new = _state(1)
    blob = spd.encode(old, new)
    assert blob is not None
    other = {k: v.copy() for k, v in old.items()}
    other["w"][0, 0] += 1
    with pytest.raises(BaseMismatchError, match="first differing key: 'w'"):
        spd.apply(blob, other)
    # unchecked base: the rebuilt crc catches it and the value is XORed back
    snapshot = other["w"].copy()
    with pytest.raises(ChecksumMismatchError, match="restored"):
        spd.apply(blob, other, check_base=False)
    assert other["w"].tobytes() == snapshot.tobytes()


def test_encoded_sizes_are_the_writers_stored_bytes(tmp_path: object) -> None:
    """``_core.encoded_sizes`` (the choice's in-memory measurement) gives each entry's stored
    bytes as a real save of the same values (XOR items: of the XOR) records them."""
    from shardpoint.storage.values import encode as encode_value

    rng = np.random.default_rng(3)
    base = rng.standard_normal(700_000).astype(np.float32)
    new = base.copy()
    new[::37] += 1e-3
    values = {
        "f32": new,
        "i64": np.arange(300_000, dtype=np.int64),
        "small": new[:100],  # under the compression minimum: raw
        "u8": (np.arange(2_100_000) % 7).astype(np.uint8),  # 1-byte dtype: plain zstd, 3 chunks
    }
    xors = {"f32": xor_bytes(byte_view(new), byte_view(base))}
    for codec in ("zstd", "zstd-bytegroup", "none"):
        items = [encode_value(k, v) for k, v in values.items()]
        bases = [byte_view(base) if k == "f32" else None for k in values]
        got = _core.encoded_sizes(items, codec=codec, level=1, chunk_bytes=1 << 20, xor_bases=bases)
        stored = {k: xors[k].view(v.dtype) if k in xors else v for k, v in values.items()}
        p = os.path.join(str(tmp_path), codec)
        sp.save_file(stored, p, compression=codec, level=1, durable=False)
        with sp.open(p) as r:
            want = [r.info(k).stored_bytes for k in values]
        assert got == want, codec
    with pytest.raises(CheckpointError, match="XOR base"):
        _core.encoded_sizes(
            [encode_value("f32", new)], codec="zstd", level=1, chunk_bytes=1 << 20,
            xor_bases=[byte_view(base)[:8]],
        )  # fmt: skip
