"""An object-store checkpoint whose index object is gone while its data shards remain (a save
killed between its shard uploads and its index put, a copy or sync that left the ``.index``
object out). The open used to say only ``s3://.../ck.index: not found``, as for a prefix where
nothing was ever saved; it now lists the prefix's "directory" once (only after the open
failed) and says that the data is there and only the index is missing, in the next script's
fresh process as in the writer's. A prefix with no shards keeps the plain "not found"."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import shardpoint as sp
from s3_server import Moto
from shardpoint.storage.paths import remote_lost_index

_NEXT = r"""
import sys, shardpoint as sp
for url in sys.argv[1:]:
    try:
        sp.load_file(url)
    except sp.NotFoundError as e:
        print("refused:", e)
"""


def test_a_lost_index_on_the_store_is_named_in_the_next_script(moto: Moto, bucket: str) -> None:
    url = f"s3://{bucket}/run/ck"
    sp.save_file({"a": np.arange(10, dtype=np.float32)}, url, shards=2)
    moto.s3.delete_object(Bucket=bucket, Key="run/ck.index")
    never = f"s3://{bucket}/run/never"
    got = subprocess.run(
        [sys.executable, "-c", _NEXT, url, never],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert got.returncode == 0, got.stderr[-2000:]
    lost, plain = got.stdout.splitlines()
    assert f"{url!r} is a shardpoint checkpoint whose index {url + '.index'!r} is missing" in lost
    assert "ck.data-00000-of-00002." in lost and "ck.data-00001-of-00002." in lost
    assert "copy the index over again, or load an earlier checkpoint" in lost
    assert plain == f"refused: {never}.index: not found (open checkpoint index)"


def test_shards_of_another_prefix_are_not_a_lost_index(moto: Moto, bucket: str) -> None:
    """``ck2``'s shards beside a prefix ``ck`` that never existed: "ck2.data-..." does not
    start with "ck.data-", so ``ck`` stays not found; an empty "directory" is no loss either;
    ``ck2`` itself opens as ever."""
    sp.save_file({"a": np.ones(3, np.float32)}, f"s3://{bucket}/ck2")
    assert remote_lost_index(f"s3://{bucket}/ck") is None
    with pytest.raises(sp.NotFoundError, match=r"ck\.index: not found"):
        sp.open(f"s3://{bucket}/ck")
    assert remote_lost_index(f"s3://{bucket}/nobucket-{bucket}/x") is None
    with sp.open(f"s3://{bucket}/ck2") as r:
        assert r.keys() == ["a"]
