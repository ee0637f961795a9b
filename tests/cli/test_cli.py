"""The ``shardpoint`` command line, run as a user would: ``python -m shardpoint`` in a subprocess.

Each command is run on a good checkpoint and on each expected failure (missing file, damaged
file, bad arguments), checking the exit status, the one-line error and that no traceback leaks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file as st_save

import shardpoint as sp
from shardpoint.cli import EXIT_DAMAGED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE


def run(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "shardpoint", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def assert_error(p: subprocess.CompletedProcess[str], status: int, *needles: str) -> None:
    assert p.returncode == status, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("shardpoint: error: ")]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def ckpt(tmp_path) -> str:
    prefix = str(tmp_path / "model")
    sp.save_file(
        {
            "net/w": np.zeros((256, 256), np.float32),
            "net/b": np.arange(10, dtype=np.float64),
            "net/h": np.ones(4, ml_dtypes.bfloat16),
            "step": 12,
            "opt/lr": 0.1,
        },
        prefix,
        metadata={"run": "abc", "epoch": 2},
    )
    return prefix


def test_help_documents_exit_codes():
    p = run("--help")
    assert p.returncode == 0
    for text in ("exit status", "1  damaged", "2  usage", "3  not found", "ls", "convert"):
        assert text in p.stdout
    assert run("convert", "--help").returncode == 0


def test_ls_lists_keys_in_order_with_totals(ckpt):
    p = run("ls", ckpt)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["KEY", "DTYPE", "SHAPE", "STORED", "RAW", "CODEC", "RATIO"]
    keys = [ln.split()[0] for ln in lines[1:-1]]
    assert keys == ["net/b", "net/h", "net/w", "opt/lr", "step"]
    w = lines[3].split()
    assert w[:3] == ["net/w", "float32", "[256,256]"] and w[-2] == "bytegroup-huffman"
    assert lines[-1].startswith("5 keys, stored ") and "raw 256.1 KiB" in lines[-1]


def test_ls_prefix_and_json(ckpt):
    p = run("ls", ckpt, "--prefix", "net/", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [e["key"] for e in doc["entries"]] == ["net/b", "net/h", "net/w"]
    w = doc["entries"][2]
    assert (w["dtype"], w["shape"], w["raw_bytes"]) == ("float32", [256, 256], 262144)
    assert w["stored_bytes"] < 10_000 and w["ratio"] > 20
    assert doc["totals"]["keys"] == 3 and doc["totals"]["raw_bytes"] == 262144 + 80 + 8
    assert run("ls", ckpt + ".index", "--prefix", "zzz").stdout.startswith("0 keys")


def test_ls_manager_directory_uses_state_file(tmp_path):
    ck = sp.Checkpoint(v=sp.Variable(np.ones(3, np.float32)))
    mgr = sp.CheckpointManager(ck, str(tmp_path / "run"), max_to_keep=2)
    for _ in range(3):
        mgr.save()
    p = run("ls", str(tmp_path / "run"), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["source"] == "state file"
    names = [c["checkpoint"] for c in doc["checkpoints"]]
    assert names == ["ckpt-2", "ckpt-3"]
    assert [c["latest"] for c in doc["checkpoints"]] == [False, True]
    assert all(c["status"] == "ok" and c["keys"] >= 2 for c in doc["checkpoints"])
    text = run("ls", str(tmp_path / "run")).stdout
    assert "ckpt-3  (latest)" in text and "2 checkpoints (from the state file)" in text


def test_ls_directory_without_state_file_finds_indexes(tmp_path):
    sp.save_file({"a": np.ones(1)}, str(tmp_path / "x"))
    sp.save_file({"a": np.ones(1)}, str(tmp_path / "y"))
    (tmp_path / "z.index").write_bytes(b"not an index at all, just junk")
    p = run("ls", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "2 checkpoints" not in p.stdout and "3 checkpoints (from the *.index files)" in p.stdout
    assert "unreadable" in p.stdout.splitlines()[3]


def test_ls_other_formats(tmp_path):
    st = str(tmp_path / "m.safetensors")
    st_save({"a": np.ones((2, 3), np.float32)}, st)
    p = run("ls", st)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1].split()[:3] == ["a", "float32", "[2,3]"]


def test_info_shows_format_shards_metadata_and_graph(tmp_path):
    class Net(sp.Module):
        def __init__(self):
            super().__init__()
            self.l1 = sp.Variable(np.ones((2, 2), np.float32))
            self.l2 = sp.Variable(np.zeros(2, np.float32))

    ck = sp.Checkpoint(net=Net(), step=sp.Variable(np.int64(3)))
    prefix = ck.write(str(tmp_path / "ck"))
    p = run("info", prefix)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"format version: {sp.FORMAT_VERSION}" in out and "shardpoint" in out
    assert "shards:         1" in out and ".data-00000-of-00001" in out
    assert "object graph:" in out and "root children: net, step" in out
    doc = json.loads(run("info", prefix, "--json").stdout)
    assert doc["object_graph"]["root_children"] == ["net", "step"]
    assert doc["object_graph"]["nodes"] >= 4 and doc["tensors"] == 3


def test_info_metadata_and_directory(ckpt, tmp_path):
    doc = json.loads(run("info", ckpt, "--json").stdout)
    assert doc["metadata"] == {"run": "abc", "epoch": 2} and doc["object_graph"] is None
    assert doc["entries"] == 5 and doc["tensors"] == 3
    # a directory without a state file: its only checkpoint, as `ls` lists it
    assert json.loads(run("info", str(tmp_path), "--json").stdout)["checkpoint"] == ckpt
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_error(run("info", str(empty)), EXIT_NOT_FOUND, "holds no checkpoint")


def test_verify_intact(ckpt):
    p = run("verify", ckpt)
    assert p.returncode == EXIT_OK, p.stderr
    assert p.stdout.startswith(f"OK {ckpt}: 5 entries, 1 shards")


def test_verify_damaged_names_file_key_offset(ckpt):
    shard = ckpt + ".data-00000-of-00001"
    info = sp.open(ckpt).info("net/b")
    with open(shard, "r+b") as f:
        f.seek(info.offset + 3)
        b = f.read(1)
        f.seek(info.offset + 3)
        f.write(bytes([b[0] ^ 0xFF]))
    p = run("verify", ckpt)
    assert_error(p, EXIT_DAMAGED, "model.data-00000-of-00001", "net/b", f"offset {info.offset}")
    assert p.stdout == ""


def test_verify_truncated_shard_and_corrupt_index(ckpt):
    shard = ckpt + ".data-00000-of-00001"
    os.truncate(shard, os.path.getsize(shard) - 1)
    assert_error(run("verify", ckpt), EXIT_DAMAGED, "data-00000-of-00001")
    with open(ckpt + ".index", "r+b") as f:
        f.seek(0)
        f.write(b"SPINDEX\0" + b"\xff" * 40)
    assert_error(run("verify", ckpt), EXIT_DAMAGED, "model.index")
    assert_error(run("ls", ckpt), EXIT_DAMAGED, "model.index")


def test_missing_inputs_are_not_found(tmp_path):
    missing = str(tmp_path / "nope")
    for cmd in (
        ["ls", missing],
        ["info", missing],
        ["verify", missing],
        ["diff", missing, missing],
    ):
        assert_error(run(*cmd), EXIT_NOT_FOUND, "nope")
    assert_error(run("convert", missing, str(tmp_path / "o")), EXIT_NOT_FOUND, "nope")


def test_bad_arguments_are_usage_errors(ckpt, tmp_path):
    assert_error(run(), EXIT_USAGE, "COMMAND")
    assert_error(run("frobnicate"), EXIT_USAGE, "invalid choice")
    assert_error(run("diff", ckpt), EXIT_USAGE, "required")
    assert_error(run("diff", ckpt, ckpt, "--atol", "abc"), EXIT_USAGE, "--atol")
    assert_error(run("diff", ckpt, ckpt, "--atol", "-1"), EXIT_USAGE, "--atol")
    assert_error(run("convert", ckpt, "o", "--compression", "lz4"), EXIT_USAGE, "lz4")
    assert_error(run("convert", ckpt, str(tmp_path / "o"), "--level", "99"), EXIT_USAGE, "level")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00junk")
    assert_error(run("ls", str(junk)), EXIT_USAGE, "unknown file format")
    st = str(tmp_path / "m.safetensors")
    st_save({"a": np.ones(2)}, st)
    assert_error(run("verify", st), EXIT_USAGE, "safetensors")


def test_diff_identical_and_different(ckpt, tmp_path):
    p = run("diff", ckpt, ckpt)
    assert p.returncode == EXIT_OK and "5 equal, 0 differ" in p.stdout
    other = str(tmp_path / "other")
    vals = sp.load_file(ckpt)
    vals["net/b"] = vals["net/b"] + np.array([0] * 9 + [0.25])
    vals["net/h"] = vals["net/h"].astype(np.float32)
    vals["step"] = 13
    del vals["opt/lr"]
    vals["new"] = np.ones(1)
    sp.save_file(vals, other)
    p = run("diff", ckpt, other)
    assert p.returncode == EXIT_DAMAGED and "Traceback" not in p.stderr
    out = p.stdout
    assert "only in A:  opt/lr" in out and "only in B:  new" in out
    assert "dtype differs:  net/h  bfloat16[4] vs float32[4]" in out
    assert "values differ:  net/b  max |a-b| = 0.25" in out
    assert "values differ:  step  12 != 13" in out
    p = run("diff", ckpt, other, "--atol", "0.5", "--json")
    doc = json.loads(p.stdout)
    assert {d["key"] for d in doc["differences"]} == {"net/h", "step"}
    assert doc["equal"]["net/b"] == 0.25 and doc["identical"] is False


def test_convert_roundtrip_through_cli_is_bitwise(tmp_path):
    src = str(tmp_path / "in.safetensors")
    want = {
        "w": np.random.default_rng(1).standard_normal((33, 17)).astype(ml_dtypes.bfloat16),
        "b": np.arange(17, dtype=np.float32),
    }
    st_save(want, src, metadata={"k": "v"})
    p = run("convert", src, str(tmp_path / "ck"), "--compression", "zstd", "--level", "3")
    assert p.returncode == 0, p.stderr
    assert "converted safetensors -> shardpoint: 2 entries" in p.stdout
    p = run("convert", str(tmp_path / "ck"), str(tmp_path / "out.safetensors"))
    assert p.returncode == 0, p.stderr
    assert run("diff", src, str(tmp_path / "out.safetensors")).returncode == EXIT_OK
    from safetensors.numpy import load_file

    got = load_file(str(tmp_path / "out.safetensors"))
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].tobytes() == v.tobytes()
    assert_error(run("convert", src, str(tmp_path / "ck")), EXIT_USAGE, "exists", "--force")
    assert run("convert", src, str(tmp_path / "ck"), "--force").returncode == 0


def test_convert_notes_go_to_stderr(ckpt, tmp_path):
    p = run("convert", ckpt, str(tmp_path / "o.safetensors"))
    assert p.returncode == 0, p.stderr
    assert "shardpoint: note: skipped 'step'" in p.stderr
    assert "3 entries" in p.stdout


def test_convert_damaged_source_fails_cleanly(ckpt, tmp_path):
    shard = ckpt + ".data-00000-of-00001"
    info = sp.open(ckpt).info("net/b")
    with open(shard, "r+b") as f:
        f.seek(info.offset)
        f.write(b"\xde\xad")
    out = str(tmp_path / "o")
    assert_error(run("convert", ckpt, out, "--compression", "none"), EXIT_DAMAGED, "net/b")
    assert not sp.exists(out)


def test_progress_flags_are_accepted_and_quiet_by_default_in_pipes(tmp_path):
    src = str(tmp_path / "a")
    sp.save_file({f"t{i}": np.ones((512, 1024), np.float32) for i in range(8)}, src)
    forced = run("--progress", "convert", src, str(tmp_path / "b"), "--no-fsync")
    assert forced.returncode == 0, forced.stderr
    assert run("verify", src, "--progress").returncode == 0  # also after the command name
    assert run("convert", src, str(tmp_path / "c"), "--no-progress").stderr == ""
    # stderr is a pipe here, so the default draws nothing
    assert run("convert", src, str(tmp_path / "d")).stderr == ""
