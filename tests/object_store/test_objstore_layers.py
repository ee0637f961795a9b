"""The layers above the file API on an S3 bucket (moto server): Checkpoint write/read/save/
restore (state object with conditional update), shardpoint.torch save/load, DCP
StorageWriter/StorageReader, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.cli import main as cli
from shardpoint.errors import CheckpointIOError


def _var(x: float) -> sp.Variable:
    return sp.Variable(np.full(4, x, dtype=np.float32))


def test_checkpoint_write_read_save_restore(moto, bucket: str) -> None:
    url = f"s3://{bucket}/obj"
    ck = sp.Checkpoint(v=_var(1.0))
    assert ck.write(f"{url}/plain") == f"{url}/plain"
    path = ck.save(f"{url}/ckpt")
    assert path == f"{url}/ckpt-1"
    assert sp.latest_checkpoint(url) == path
    # the state object lives next to the checkpoints
    assert "obj/checkpoint" in moto.keys(bucket)
    ck2 = sp.Checkpoint(v=_var(0.0))
    ck2.read(f"{url}/plain").assert_consumed()
    np.testing.assert_array_equal(np.asarray(ck2.v.numpy()), np.full(4, 1.0, np.float32))
    ck3 = sp.Checkpoint(v=_var(0.0))
    ck3.restore(sp.latest_checkpoint(url)).assert_consumed()
    assert int(ck3.save_counter) == 1


def test_state_object_update_is_conditional(moto, bucket: str) -> None:
    """The state object is replaced with If-Match on the etag this process saw: a change made
    meanwhile by someone else makes the update fail instead of being silently overwritten."""
    url = f"s3://{bucket}/cond"
    ck = sp.Checkpoint(v=_var(1.0))
    ck.save(f"{url}/ckpt")
    ck.save(f"{url}/ckpt")
    assert sp.latest_checkpoint(url) == f"{url}/ckpt-2"
    moto.s3.put_object(Bucket=bucket, Key="cond/checkpoint", Body=b'model_checkpoint_path: "x"\n')
    with pytest.raises(CheckpointIOError, match="another writer changed it first"):
        ck.save(f"{url}/ckpt")


def test_torch_save_load(moto, bucket: str) -> None:
    torch = pytest.importorskip("torch")
    import shardpoint.torch as spt

    url = f"s3://{bucket}/torch/model"
    state = {"layer": {"w": torch.randn(16, 8), "b": torch.zeros(8)}, "step": 3}
    spt.save(state, url)
    got = spt.load(url)
    torch.testing.assert_close(got["layer"]["w"], state["layer"]["w"])
    assert got["step"] == 3


def test_dcp_save_load(moto, bucket: str) -> None:
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import shardpoint.torch as spt

    url = f"s3://{bucket}/dcp/step-1"
    state = {"w": torch.randn(32, 4), "b": torch.arange(6.0)}
    dcp.save(state, storage_writer=spt.StorageWriter(url, threads=2))
    target = {"w": torch.zeros(32, 4), "b": torch.zeros(6)}
    dcp.load(target, storage_reader=spt.StorageReader(url))
    torch.testing.assert_close(target["w"], state["w"])
    torch.testing.assert_close(target["b"], state["b"])
    assert spt.StorageReader.validate_checkpoint_id(url)


def test_cli_ls_verify_convert_gc(moto, bucket: str, tmp_path, capsys) -> None:
    local = str(tmp_path / "src")
    sp.save_file({"a": np.arange(10, dtype=np.float32), "b": "x"}, local)
    url = f"s3://{bucket}/cli/ck"
    assert cli(["convert", local, url]) == 0
    capsys.readouterr()
    assert cli(["ls", url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(r["key"] for r in out["entries"]) == ["a", "b"]
    assert cli(["verify", url]) == 0
    assert "OK" in capsys.readouterr().out
    back = str(tmp_path / "back")
    assert cli(["convert", url, back]) == 0
    np.testing.assert_array_equal(sp.load_file(back)["a"], np.arange(10, dtype=np.float32))
    assert cli(["convert", local, url]) == 2  # exists
    assert cli(["gc", f"s3://{bucket}/cli", "--older-than", "0"]) == 0
    assert cli(["verify", f"s3://{bucket}/cli/missing"]) == 3


def test_list_dir_and_object_ops(moto, bucket: str) -> None:
    base = f"s3://{bucket}/ops"
    storage = sp.storage
    storage.write_object(f"{base}/a.txt", b"hello", mode="create")
    with pytest.raises(CheckpointIOError, match="another writer changed it first"):
        storage.write_object(f"{base}/a.txt", b"again", mode="create")
    data, etag = storage.read_object(f"{base}/a.txt")
    assert data == b"hello" and etag
    storage.write_object(f"{base}/a.txt", b"v2", mode="update", etag=etag)
    with pytest.raises(CheckpointIOError, match="another writer changed it first"):
        storage.write_object(f"{base}/a.txt", b"v3", mode="update", etag=etag)
    assert storage.list_url(base) == ["a.txt"]
    storage.delete_object(f"{base}/a.txt")
    assert storage.list_url(base) == []
