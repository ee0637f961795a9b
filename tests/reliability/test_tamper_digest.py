"""Strong digests (FORMAT.md §7.1): recorded while writing, checked by ``verify(strong=True)``
and ``shardpoint verify --strong``; what they catch that crc32c cannot (a value rewritten with
its crc recomputed), and what they cannot catch alone (the manifest rewritten too: only a root
digest kept elsewhere, ``expect=``, tells)."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers.tamper import replace_in_metadata, rewrite_raw_value
from shardpoint import _core
from shardpoint.cli import EXIT_DAMAGED, EXIT_OK, main
from shardpoint.errors import DigestMismatchError, DigestMissingError, InvalidArgumentError


def _values() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((256, 256)).astype(np.float32),
        "b": np.arange(64, dtype=np.int64),
        "step": 7,
    }


def _manifest(prefix: str) -> dict:
    with sp.open(prefix) as r:
        return r.format_info["digest"]


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
def test_manifest_is_the_digest_of_each_file_as_written(tmp_path, algo):
    p = str(tmp_path / "ck")
    sp.save_file(_values(), p, digest=algo, shards=2, compression="none")
    man = _manifest(p)
    assert man["algorithm"] == algo
    with sp.open(p) as r:
        shard_files = {os.path.basename(f): n for f, n in r.format_info["shards"]}
        report = r.verify(strong=True)
    names = {"ck" + f["name"]: f["len"] for f in man["files"]}
    assert names == shard_files  # every shard, its exact length
    for f in man["files"]:
        data = (tmp_path / ("ck" + f["name"])).read_bytes()
        want = hashlib.sha256(data).hexdigest() if algo == "sha256" else None
        assert f["digest"] == (want or _core.digest_bytes("blake3", data))
    index = (tmp_path / "ck.index").read_bytes()
    assert report.root == _core.digest_bytes(algo, index)
    assert str(report) == f"{algo}:{report.root}"
    assert report.files == 2 and report.bytes == sum(shard_files.values())
    if algo == "sha256":  # what `sha256sum ck.index` prints
        assert report.root == hashlib.sha256(index).hexdigest()


def test_digest_bytes_known_answers():
    data = np.random.default_rng(3).integers(0, 256, 3 << 20, dtype=np.uint8)
    assert _core.digest_bytes("sha256", data) == hashlib.sha256(data.tobytes()).hexdigest()
    # BLAKE3 reference test vector of the empty input
    assert _core.digest_bytes("blake3", b"") == (
        "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    )


def test_crc_patched_value_passes_crc_checks_but_not_the_strong_digest(tmp_path, capsys):
    p = str(tmp_path / "ck")
    vals = _values()
    sp.save_file(vals, p, digest="sha256", compression="none")
    evil = np.array(vals["b"], dtype=np.int64)
    evil[3] = 1_000_000
    shard = rewrite_raw_value(p, "b", evil.tobytes())
    # The attacker's change is invisible to every crc check ...
    with sp.open(p) as r:
        r.verify()
        assert int(r["b"][3]) == 1_000_000
        # ... and the strong digest names the file.
        with pytest.raises(DigestMismatchError, match=os.path.basename(shard)):
            r.verify(strong=True)
    status, out, _ = _cli(capsys, "verify", p)
    assert status == EXIT_OK and out.startswith("OK ")
    status, _, err = _cli(capsys, "verify", "--strong", p)
    assert status == EXIT_DAMAGED
    assert os.path.basename(shard) in err and "sha256" in err


def test_manifest_rewritten_too_is_caught_only_by_a_root_kept_elsewhere(tmp_path, capsys):
    p = str(tmp_path / "ck")
    vals = _values()
    sp.save_file(vals, p, digest="sha256", compression="none")
    with sp.open(p) as r:
        root = str(r.verify(strong=True))
    status, out, _ = _cli(capsys, "verify", "--strong", "--expect", root, p)
    assert status == EXIT_OK and root in out and "matches --expect" in out
    evil = np.array(vals["b"], dtype=np.int64)
    evil[0] = -1
    shard = rewrite_raw_value(p, "b", evil.tobytes())
    old = _manifest(p)["files"][0]["digest"]
    replace_in_metadata(p, old, hashlib.sha256(open(shard, "rb").read()).hexdigest())
    with sp.open(p) as r:
        r.verify()
        forged = r.verify(strong=True)  # the manifest now agrees with the forged shard
        assert str(forged) != root
        with pytest.raises(DigestMismatchError, match="root digest"):
            r.verify(strong=True, expect=root)
    status, _, err = _cli(capsys, "verify", "--strong", "--expect", root, p)
    assert status == EXIT_DAMAGED and "root digest" in err


def test_checkpoint_saved_without_digest_says_so(tmp_path, capsys):
    p = str(tmp_path / "ck")
    sp.save_file(_values(), p)
    with sp.open(p) as r:
        assert r.verify() is None
        with pytest.raises(DigestMissingError, match="no digest manifest"):
            r.verify(strong=True)
    status, _, err = _cli(capsys, "verify", "--strong", p)
    assert status == EXIT_DAMAGED and "no digest manifest" in err
    from safetensors.numpy import save_file as st_save

    hf = tmp_path / "hf"
    hf.mkdir()
    st_save({"w": np.ones(4, np.float32)}, str(hf / "model.safetensors"))
    status, _, err = _cli(capsys, "verify", "--strong", str(hf))
    assert status == EXIT_DAMAGED and "no digest manifest" in err
    with pytest.raises(InvalidArgumentError, match="digest"):
        sp.save_file(_values(), p, digest="md5")
    with pytest.raises(InvalidArgumentError, match="64 hex"):
        sp.open(p).verify(strong=True, expect="sha256:abc")


def test_every_save_path_records_a_complete_manifest(tmp_path):
    vals = _values()
    big = {"frozen": np.ones(1 << 20, np.float32), **vals}
    # incremental: linked shards take the base's digests, or are hashed when it has none
    base = str(tmp_path / "base")
    sp.save_file(big, base, incremental=True, digest="blake3")
    inc = str(tmp_path / "inc")
    sp.save_file({**big, "step": 8}, inc, base=base, digest="blake3")
    plain = str(tmp_path / "plain")
    sp.save_file(big, plain, incremental=True)
    inc2 = str(tmp_path / "inc2")
    sp.save_file({**big, "step": 9}, inc2, base=plain, digest="sha256")
    for p in (inc, inc2):
        with sp.open(p) as r:
            assert r.format_info["incremental"]["linked_shards"] >= 1
            r.verify(strong=True)
    base_digests = {f["len"]: f["digest"] for f in _manifest(base)["files"]}
    assert any(f["digest"] in base_digests.values() for f in _manifest(inc)["files"])
    # multi-writer: the merge concatenates the partials' manifests
    mw = str(tmp_path / "mw")
    for rank in range(2):
        with sp.Writer(mw, rank=rank, world_size=2, merge_token="s1", digest="sha256") as w:
            w.add(f"rank{rank}", np.full(1000, rank, np.float32))
    sp.merge(mw, 2, token="s1")
    assert len(_manifest(mw)["files"]) == 2
    sp.open(mw).verify(strong=True)
    # object graph: Checkpoint.save and a manager, blocking and asynchronous
    ckpt = sp.Checkpoint(v=sp.Variable(np.arange(10.0)))
    path = ckpt.save(str(tmp_path / "obj" / "ckpt"), digest="sha256")
    sp.open(path).verify(strong=True)
    mgr = sp.CheckpointManager(ckpt, str(tmp_path / "mgr"), max_to_keep=2, digest="blake3")
    mgr.save()
    mgr.save(blocking=False).result()
    latest = sp.latest_checkpoint(str(tmp_path / "mgr"))
    assert _manifest(latest)["algorithm"] == "blake3"
    sp.open(latest).verify(strong=True)
    # asynchronous save_file
    fut = sp.save_file(vals, str(tmp_path / "async"), digest="sha256", blocking=False)
    assert fut is not None
    fut.result()
    assert json.dumps(_manifest(str(tmp_path / "async")))
    sp.open(str(tmp_path / "async")).verify(strong=True)


def test_object_store_checkpoint_is_verified_strongly_through_ranged_reads(tmp_path):
    """A save to a URL hashes what it uploads; strong verification fetches every shard object.
    The crc-patched checkpoint, uploaded as is, passes every crc check there too."""
    url = f"memory://digest-{os.getpid()}/run/ck"
    vals = _values()
    sp.save_file(vals, url, digest="sha256", compression="none", shards=2)
    with sp.open(url) as r:
        report = r.verify(strong=True)
    index, _ = sp.storage.read_object(url + ".index")
    assert report.root == hashlib.sha256(index).hexdigest() and report.files == 2
    # a forged checkpoint, made locally and uploaded file by file (its index names its shards)
    p = str(tmp_path / "ck")
    sp.save_file(vals, p, digest="sha256", compression="none", shards=2)
    evil = np.array(vals["b"], dtype=np.int64)
    evil[1] = 42
    rewrite_raw_value(p, "b", evil.tobytes())
    forged = str(tmp_path / "forged")
    for f in os.listdir(tmp_path):
        if f.startswith("ck."):
            os.link(tmp_path / f, forged + f[2:])
    up = f"memory://digest-{os.getpid()}/run/forged"
    for f in os.listdir(tmp_path):
        if f.startswith("forged."):
            sp.storage.write_object(up + f[len("forged") :], (tmp_path / f).read_bytes())
    with sp.open(up) as r:
        r.verify()
        with pytest.raises(DigestMismatchError):
            r.verify(strong=True)
