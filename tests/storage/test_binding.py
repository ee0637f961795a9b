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


@pytest.mark.parametrize("where", ["local", "memory"])
def test_infos_answers_as_info_for_many_keys(tmp_path, where: str) -> None:
    """``infos`` (a plan's one call for every record) gives each key's record exactly as
    ``info`` does, in the order asked, on both cores; a missing key raises naming it."""
    import uuid

    prefix = str(tmp_path / "e") if where == "local" else f"memory://b-{uuid.uuid4().hex}/run/e"
    rng = np.random.default_rng(3)
    sp.save_file(
        {
            "w": rng.standard_normal((300, 257)).astype(np.float32),  # compressed, chunked
            "z": np.zeros((64, 1024), np.float32),
            "s": np.float64(2.5),  # 0-d
            "big": rng.integers(0, 255, 3 << 20, dtype=np.uint8),  # stored raw, in crc blocks
            "name": "model",
            "step": 7,
        },
        prefix,
        compression="zstd",
    )
    with sp.open(prefix) as r:
        keys = r.keys()
        asked = [keys[3], keys[0], *keys]  # any order, repeats allowed
        want = [r.info(k) for k in asked]
        assert r._infos(asked) == want
        assert {i.kind for i in want} >= {"tensor", "str", "int"}
        assert any(i.codec != "none" for i in want) and any(i.crc_blocks for i in want)
        rows = r._core.infos(asked)
        assert [i.key for i in want] == [row[0] for row in rows] == asked
        with pytest.raises(sp.MissingKeyError, match="'?\"?nope"):
            r._core.infos([keys[0], "nope"])
        with pytest.raises(TypeError):
            r._core.infos([3])  # a key that is not a str
