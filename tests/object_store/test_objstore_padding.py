"""Issue 23 item 4 on an object store: ``verify`` of a remote checkpoint fetches the padding of
each shard too (after the header, between payloads) and refuses a non-zero byte there, naming
the object and the offset."""

from __future__ import annotations

import numpy as np
import pytest

import shardpoint as sp
from s3_server import Moto


def test_nonzero_padding_in_a_remote_shard_fails_verify(moto: Moto, bucket: str) -> None:
    url = f"s3://{bucket}/pad/ck"
    vals = {"a": np.arange(10, dtype=np.float32), "b": np.arange(5, dtype=np.int16)}
    sp.save_file(vals, url, compression="none")
    with sp.open(url) as r:
        r.verify()
        (shard_url, _), *_ = r.format_info["shards"]
        end_a = r.info("a").offset + r.info("a").stored_bytes
    key = shard_url.split(f"s3://{bucket}/", 1)[1]
    data = moto.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    for at in (100, end_a):  # after the header; between "a" and "b"
        assert data[at] == 0
        damaged = data[:at] + b"\x01" + data[at + 1 :]
        moto.s3.put_object(Bucket=bucket, Key=key, Body=damaged)
        with sp.open(url) as r:
            np.testing.assert_array_equal(r["a"], vals["a"])
            with pytest.raises(sp.CorruptCheckpointError, match=rf"{key}.*offset {at}"):
                r.verify()
    moto.s3.put_object(Bucket=bucket, Key=key, Body=data)
    with sp.open(url) as r:
        r.verify()
