"""A store that answers wrongly (bytes from the network are hostile, DESIGN.md §3): a ranged GET
answered with the whole object (200 instead of 206), with another range, or with a body shorter
or longer than its Content-Range says (the proxy of ``s3_server``, a real HTTP forwarder in
front of moto), and a shard object shorter or longer than the index records. Each read raises
our error naming the shard object; none returns a value."""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
from s3_server import Moto, Proxy, opts_for
from shardpoint.errors import CheckpointIOError, CorruptCheckpointError


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "w": np.arange(60_000, dtype=np.float32),
        "z": np.round(rng.standard_normal(30_000), 1).astype(np.float32),
    }


def _reads(url: str, opts: dict[str, str] | None = None) -> dict[str, object]:
    """Every remote read API, each returning what it read."""

    def whole() -> object:
        return sp.load_file(url, storage_options=opts)

    def one() -> object:
        with sp.open(url, storage_options=opts) as r:
            return r["z"]

    def rows() -> object:
        with sp.open(url, storage_options=opts) as r:
            return r.slice("w", 10, 20)

    def verify() -> object:
        with sp.open(url, storage_options=opts) as r:
            return r.verify()

    return {"load_file": whole, "get": one, "slice": rows, "verify": verify}


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize(
    ("mode", "error", "says"),
    [
        ("full", CheckpointIOError, "non-partial response when range requested"),
        ("shift", CheckpointIOError, r"Requested (\d+)\.\.\d+, got (?!\1\.)\d+\.\."),
        ("short", CorruptCheckpointError, "asked for"),
        ("long", CorruptCheckpointError, "asked for"),
    ],
)
def test_wrong_answers_to_ranged_gets(
    moto: Moto, bucket: str, proxy: Proxy, codec: str, mode: str, error: type, says: str
) -> None:
    url = f"s3://{bucket}/ranged/{codec}"
    values = _values()
    sp.save_file(values, url, compression=codec)
    opts = opts_for(proxy)
    got = sp.load_file(url, storage_options=opts)  # through the proxy, answering rightly
    assert all(np.array_equal(got[k], values[k]) for k in values)
    for name, read in _reads(url, opts).items():
        proxy.range_fault(mode)
        try:
            with pytest.raises(error, match=says) as e:
                read()
        finally:
            faulted = list(proxy.range_faulted)
            proxy.range_fault(None)
        assert faulted, f"{name}: no ranged GET was answered wrongly"
        assert f"s3://{bucket}/ranged/{codec}.data-00000-of-00001" in str(e.value), name


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("change", ["half", "one_byte_short", "longer"])
def test_a_shard_object_of_another_length_than_the_index_records(
    moto: Moto, bucket: str, codec: str, change: str
) -> None:
    """The object replaced by a shorter or longer one (a foreign tool, a partial copy): the
    reads that reach it raise CorruptCheckpointError naming the object; a range that starts
    past the shortened object's end (416 from the store) is one too, not an I/O error."""
    url = f"s3://{bucket}/len/{codec}"
    sp.save_file(_values(), url, compression=codec)
    (key,) = [k for k in moto.keys(bucket) if ".data-" in k]
    data = moto.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    new = {"half": data[: len(data) // 2], "one_byte_short": data[:-1], "longer": data + bytes(64)}
    moto.s3.put_object(Bucket=bucket, Key=key, Body=new[change])
    for name, read in _reads(url).items():
        with pytest.raises(CorruptCheckpointError) as e:
            read()
        assert f"s3://{bucket}/{key}" in str(e.value), (name, e.value)
