"""`gc` finds the multipart uploads of killed writers with S3's ListMultipartUploads (issue 42;
docs/OBJECT_STORE.md "Writers that die"): a save writes no upload marker, so a writer
SIGKILLed after creating an upload and uploading a part, before completing it, leaves an
upload that only that listing names. Real writer processes (``sp.save_file`` with the
library's ``upload.part`` kill and delay points, rust/src/fault.rs) against a real S3 server
(moto); the CLI in its own process too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
pytest.importorskip("boto3", reason="needs boto3 (requirements-dev)")

import shardpoint as sp  # noqa: E402 - after the importorskips
from s3_server import Moto, moto_environment  # noqa: E402

PART = 5 << 20  # moto's smallest part
N = (6 << 20) // 4  # float32 values: a 6 MiB shard, 2 parts
TIMEOUT = 60.0

# One writer process: saves N float32 values to argv[1] as 5 MiB parts, then says so.
WRITER = f"""
import sys
import numpy as np
import shardpoint as sp
v = np.arange({N}, dtype=np.float32)
sp.save_file({{"v": v}}, sys.argv[1], compression="none",
             storage_options={{"part_size": "{PART}"}})
print("SAVED", flush=True)
"""


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    with moto_environment() as m:
        yield m


def writer(url: str, **points: str) -> subprocess.Popen[str]:
    """A writer process saving to `url`; `points`: SHARDPOINT_TEST_* variables (KILL_AT...)."""
    env = {**os.environ, **{f"SHARDPOINT_TEST_{k}": v for k, v in points.items()}}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def killed(p: subprocess.Popen[str]) -> None:
    """`p` died of the SIGKILL its kill point sent (not of an error)."""
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])


def uploads(moto: Moto, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """(key, upload id) of the incomplete uploads under `prefix`, asked with a prefix."""
    got = moto.s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    return [(u["Key"], u["UploadId"]) for u in got]


def parts(moto: Moto, bucket: str, key: str, upload_id: str) -> int:
    got = moto.s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)
    return len(got.get("Parts", []))


def test_gc_aborts_a_killed_writers_upload_cli_and_function(moto: Moto) -> None:
    """Two writers killed mid-upload (one part up, not completed) under ``a/`` and ``b/``,
    and an upload someone else started under ``other/``: ``shardpoint gc s3://B/a`` (the CLI,
    its own process) aborts the one under ``a/``, ``sp.storage.gc`` the one under ``b/``;
    ListMultipartUploads shows none under either afterwards and ``other/``'s is untouched."""
    bucket = moto.bucket()
    procs = [writer(f"s3://{bucket}/{d}/ckpt", KILL_AT="upload.part") for d in "ab"]
    for p in procs:
        killed(p)
    other = moto.s3.create_multipart_upload(Bucket=bucket, Key="other/ckpt.data-00000-of-00001.x")
    for d in "ab":
        (up,) = uploads(moto, bucket, f"{d}/")
        assert ".data-" in up[0] and parts(moto, bucket, *up) >= 1, up
    assert moto.keys(bucket) == []  # no marker, no shard: the upload is all a kill leaves

    cli = subprocess.run(
        [sys.executable, "-m", "shardpoint", "gc", f"s3://{bucket}/a", "--older-than", "0"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "removed 1 " in cli.stdout, cli.stdout
    assert uploads(moto, bucket, "a/") == []
    assert len(uploads(moto, bucket, "b/")) == 1

    assert sp.storage.gc(f"s3://{bucket}/b", older_than=0) == 1
    assert uploads(moto, bucket, "b/") == []
    assert uploads(moto, bucket, "") == [(other["Key"], other["UploadId"])]
    assert sp.storage.gc(f"s3://{bucket}/b", older_than=0) == 0  # nothing left to find


def test_gc_spares_a_live_writers_upload(moto: Moto) -> None:
    """A writer killed mid-upload, then (4.5 s later) a live writer whose upload is in
    progress (held at each finished part by a delay point): ``gc --older-than 2.5`` aborts the
    dead writer's upload only. The live writer then completes its save, which reads back.
    (moto reports every upload as initiated in 2010: the live one is told apart by its
    newest part, as a live writer of a large shard on S3 is.)"""
    bucket = moto.bucket()
    dead = writer(f"s3://{bucket}/c/dead", KILL_AT="upload.part")
    killed(dead)
    time.sleep(4.5)
    live_url = f"s3://{bucket}/c/live"
    live = writer(live_url, DELAY_AT="upload.part:1500")
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            ups = [u for u in uploads(moto, bucket, "c/live") if parts(moto, bucket, *u) >= 1]
            if ups or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(ups) == 1, uploads(moto, bucket, "")
        assert len(uploads(moto, bucket, "c/")) == 2
        assert sp.storage.gc(f"s3://{bucket}/c", older_than=2.5) == 1
        assert uploads(moto, bucket, "c/dead") == []
        assert uploads(moto, bucket, "c/live") == ups  # the live upload goes on
        out, err = live.communicate(timeout=TIMEOUT)
        assert live.returncode == 0 and "SAVED" in out, err[-2000:]
    finally:
        if live.poll() is None:
            live.kill()
    np.testing.assert_array_equal(sp.load_file(live_url)["v"], np.arange(N, dtype=np.float32))
    assert uploads(moto, bucket, "") == []


def test_gc_still_clears_a_previous_versions_marker(moto: Moto) -> None:
    """A writer of the previous version recorded its upload id in ``<shard>.upload`` before
    its first part; killed, it left both. ``gc`` aborts the upload and deletes the marker,
    and a marker whose upload is already gone is deleted too."""
    bucket = moto.bucket()
    key = "old/ckpt.data-00000-of-00001.0123456789abcdef"
    up = moto.s3.create_multipart_upload(Bucket=bucket, Key=key)
    moto.s3.upload_part(
        Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 16
    )
    moto.s3.put_object(Bucket=bucket, Key=f"{key}.upload", Body=up["UploadId"].encode())
    gone = "old/ckpt.data-00000-of-00001.fedcba9876543210.upload"
    moto.s3.put_object(Bucket=bucket, Key=gone, Body=b"an-upload-id-nobody-knows")
    assert sp.storage.gc(f"s3://{bucket}/old", older_than=0) == 2  # one upload, one stale marker
    assert uploads(moto, bucket, "") == []
    assert moto.keys(bucket) == []
