"""The compiled module's boundary: named records, keyword-only options, one error mapping."""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.errors as errors
from shardpoint import _core


def test_every_core_error_maps_to_a_checkpoint_error_class() -> None:
    names = _core.error_class_names()
    assert len(names) == len(set(names)) >= 9
    for name in names:
        cls = getattr(errors, name)  # AttributeError here = a class the core maps to is gone
        assert issubclass(cls, errors.CheckpointError), name


def test_a_missing_exception_class_fails_loudly(tmp_path, monkeypatch) -> None:
    monkeypatch.delattr(errors, "NotFoundError")
    with pytest.raises(SystemError, match="NotFoundError is missing"):
        _core.CheckpointReader(str(tmp_path / "nothing-here"))


def test_name_errors_cross_through_the_mapping(tmp_path) -> None:
    opts = dict(level=1, chunk_bytes=1 << 20, shards=1, durable=False, rank=0, world_size=1)
    with pytest.raises(sp.InvalidArgumentError, match="unknown compression"):
        _core.Writer(str(tmp_path / "a"), codec="brotli", metadata_json="{}", **opts)
    w = _core.Writer(str(tmp_path / "b"), codec="zstd", metadata_json="{}", **opts)
    with pytest.raises(sp.UnsupportedDTypeError):
        w.add("k", "float33", "tensor", [1], np.zeros(4, np.uint8))
    with pytest.raises(sp.InvalidArgumentError, match="unknown entry kind"):
        w.add("k", "float32", "tensr", [1], np.zeros(4, np.uint8))
    w.abort()


def test_options_are_keyword_only(tmp_path) -> None:
    with pytest.raises(TypeError):
        _core.save(str(tmp_path / "c"), [], "zstd", 1, 1 << 20, 1, False, "{}")


def test_info_and_get_return_named_records(tmp_path) -> None:
    p = str(tmp_path / "d")
    sp.save_file({"x": np.arange(12, dtype=np.int32).reshape(3, 4)}, p, compression="none")
    r = _core.CheckpointReader(p)
    rec = r.info("x")
    assert (rec.dtype, rec.shape, rec.kind, rec.codec) == ("int32", [3, 4], "tensor", "none")
    assert rec.raw_len == rec.stored_len == 48 and rec.shard == 0
    assert rec.nchunks == 0  # stored raw: no chunk table
    v = r.get("x")
    assert (v.dtype, v.shape, v.kind) == ("int32", [3, 4], "tensor")
    assert np.frombuffer(v.buffer, np.int32).tolist() == list(range(12))
    (m,) = r.get_many(["x"])
    assert bytes(m.buffer) == bytes(v.buffer)
