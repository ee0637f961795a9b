"""Shards under hashed key prefixes (``hashed_prefixes=True``, FORMAT.md §3.1.1) in a local
directory: where the files go, every read path, multi-writer merge, incremental links, gc of a
killed writer's files, replacement and removal, and refusal of hostile names."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import reference_reader as rr
import shardpoint as sp
from reference_crc import crc32c
from shardpoint.cli import main as cli
from shardpoint.errors import CorruptCheckpointError, InvalidArgumentError
from shardpoint.storage import gc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _values() -> dict[str, np.ndarray]:
    return {f"w{i}": np.arange(100 * (i + 1), dtype=np.float32) * i for i in range(6)}


def _tree(d) -> list[str]:
    """Every file under ``d`` (relative, sorted), lock files left out."""
    out = []
    for root, _, files in os.walk(d):
        out += [os.path.relpath(os.path.join(root, f), d) for f in files if not f.endswith(".lock")]
    return sorted(out)


def _hh(s: int, n: int) -> str:
    """The hashed directory of shard ``s`` of ``n``, computed as FORMAT.md §3.1.1 says."""
    return f"{crc32c(f'.data-{s:05d}-of-{n:05d}'.encode()) & 0xFF:02x}"


def _index_version(prefix) -> int:
    with open(f"{prefix}.index", "rb") as f:
        return struct.unpack("<I", f.read(12)[8:12])[0]


def test_round_trip_puts_shards_under_hashed_directories(tmp_path) -> None:
    vals = _values()
    p = tmp_path / "run" / "ckpt"
    sp.save_file(vals, p, shards=3, hashed_prefixes=True)
    assert _tree(tmp_path / "run") == ["ckpt.index"] + sorted(
        f"ckpt/{_hh(s, 3)}/data-{s:05d}-of-00003" for s in range(3)
    )
    assert _index_version(p) == 2
    got = sp.load_file(p)
    for k, v in vals.items():
        np.testing.assert_array_equal(got[k], v)
    with sp.open(p) as r:
        r.verify()
        np.testing.assert_array_equal(r.slice("w5", 10, 20), vals["w5"][10:20])
        out = {k: np.empty_like(v) for k, v in vals.items()}
        r.load_into(out)
        for k, v in vals.items():
            np.testing.assert_array_equal(out[k], v)
        shards = sorted(os.fspath(s) for s, _ in r.format_info["shards"])
        assert all(s.startswith(f"{p}/") for s in shards), shards
    # the reference reader, written from FORMAT.md alone, reads the same values
    ref, _ = rr.load(p)
    for k, v in vals.items():
        np.testing.assert_array_equal(ref[k], v)


def test_off_by_default_and_a_fresh_process_reads_it(tmp_path) -> None:
    sp.save_file(_values(), tmp_path / "plain", shards=2)
    assert not os.path.isdir(tmp_path / "plain") and _index_version(tmp_path / "plain") == 1
    # an asynchronous save takes the option too
    sp.save_file(_values(), tmp_path / "h", shards=2, hashed_prefixes=True, blocking=False).result()
    assert os.path.isdir(tmp_path / "h" / _hh(1, 2))
    code = textwrap.dedent(
        f"""
        import numpy as np, shardpoint as sp
        got = sp.load_file({os.fspath(tmp_path / "h")!r})
        assert float(got["w5"].sum()) == float((np.arange(600, dtype=np.float32) * 5).sum())
        print(len(got))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6"


def test_cli_info_and_verify_take_the_prefix_not_its_directory(tmp_path, capsys) -> None:
    p = tmp_path / "ck"
    sp.save_file(_values(), p, shards=2, hashed_prefixes=True)
    assert cli(["verify", os.fspath(p)]) == 0
    assert cli(["info", os.fspath(p)]) == 0
    out = capsys.readouterr().out
    assert f"{p}/{_hh(0, 2)}/data-00000-of-00002" in out


def test_multi_writer_merge(tmp_path) -> None:
    p = tmp_path / "mw"
    for r in range(3):
        with sp.Writer(
            p, rank=r, world_size=3, shards=2, merge_token="s", hashed_prefixes=True
        ) as w:
            w.add(f"k{r}", np.full(10, r, np.int64))
    sp.merge(p, 3, token="s", hashed_prefixes=True)  # the partials are hashed too
    assert _index_version(p) == 2
    assert _tree(tmp_path) == ["mw.index"] + sorted(
        f"mw/{_hh(s, 6)}/data-{s:05d}-of-00006" for s in range(6)
    )
    got = sp.load_file(p)
    assert {k: int(v[0]) for k, v in got.items()} == {"k0": 0, "k1": 1, "k2": 2}


def test_replacing_and_removing_leave_no_files(tmp_path) -> None:
    p = tmp_path / "ck"
    sp.save_file({"a": np.arange(3)}, p, shards=2, hashed_prefixes=True)
    sp.save_file({"a": np.arange(4)}, p, shards=2)  # plain over hashed
    assert _tree(tmp_path) == ["ck.data-00000-of-00002", "ck.data-00001-of-00002", "ck.index"]
    assert not os.path.exists(p)  # its empty hashed directories went with the shards
    sp.save_file({"a": np.arange(5)}, p, shards=3, hashed_prefixes=True)  # hashed over plain
    assert [f for f in _tree(tmp_path) if not f.startswith("ck/")] == ["ck.index"]
    np.testing.assert_array_equal(sp.load_file(p)["a"], np.arange(5))
    sp.remove(p)
    assert _tree(tmp_path) == [] and not os.path.exists(p)


def test_incremental_links_into_hashed_directories(tmp_path) -> None:
    big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: a shard of its own, linked
    sp.save_file({"big": big, "s": np.arange(3)}, tmp_path / "a", incremental=True)
    sp.save_file(
        {"big": big, "s": np.arange(4)}, tmp_path / "b", base=tmp_path / "a", hashed_prefixes=True
    )
    with sp.open(tmp_path / "b") as r:
        r.verify()
        assert r.metadata is not None
        shards = [os.fspath(s) for s, _ in r.format_info["shards"]]
    assert len(shards) == 2 and all(s.startswith(f"{tmp_path / 'b'}/") for s in shards)
    linked = [s for s in shards if os.stat(s).st_nlink == 2]
    assert len(linked) == 1  # the unchanged value's shard is a link of a's
    sp.remove(tmp_path / "a")
    np.testing.assert_array_equal(sp.load_file(tmp_path / "b")["big"], big)


def test_gc_removes_a_killed_writers_hashed_files_only(tmp_path) -> None:
    sp.save_file(_values(), tmp_path / "kept", shards=2, hashed_prefixes=True)
    kept = _tree(tmp_path)
    (tmp_path / "kept" / "notes.txt").write_text("a user's file stays")
    (tmp_path / "kept" / "ab").mkdir()
    (tmp_path / "kept" / "ab" / "data-notes.txt").write_text("looks hashed, is not: stays")
    # rank 1 published its shard and partial index; rank 0 was killed mid-save (temp files)
    with sp.Writer(tmp_path / "dead", rank=1, world_size=2, shards=2, hashed_prefixes=True) as w:
        w.add("k1", np.arange(10))
    code = textwrap.dedent(
        f"""
        import os, signal, numpy as np, shardpoint as sp
        w = sp.Writer({os.fspath(tmp_path / "dead")!r}, rank=0, world_size=2, shards=2,
                      hashed_prefixes=True)
        w.add("k0", np.arange(100000))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == -signal.SIGKILL, out.stderr
    dead = [f for f in _tree(tmp_path) if f.startswith("dead")]
    temps = [f for f in dead if ".tmp-" in f]
    assert len(temps) == 2 and all(f.startswith("dead/") for f in temps), dead
    assert len(dead) == 2 + 2 + 1  # temps, rank 1's shards, its partial index
    assert gc(os.fspath(tmp_path), older_than=3600) == 0  # too young
    assert gc(os.fspath(tmp_path), older_than=0) == 5
    assert _tree(tmp_path) == sorted(kept + ["kept/notes.txt", "kept/ab/data-notes.txt"])
    sp.open(tmp_path / "kept").verify()
    sp.remove(tmp_path / "kept")  # removes its shards only
    assert _tree(tmp_path) == ["kept/ab/data-notes.txt", "kept/notes.txt"]


def test_not_with_single_file_or_delta(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="single-file"):
        sp.save_file({"a": np.arange(3)}, tmp_path / "m.sp", hashed_prefixes=True)
    sp.save_file({"a": np.arange(3)}, tmp_path / "b")
    with pytest.raises(InvalidArgumentError, match="hashed_prefixes"):
        sp.save_file(
            {"a": np.arange(3)}, tmp_path / "d", base=tmp_path / "b", delta=True,
            hashed_prefixes=True,
        )  # fmt: skip


@pytest.mark.parametrize(
    "mangle",
    [
        lambda hh, rest: f"/{int(hh, 16) ^ 1:02x}{rest}",  # wrong hash
        lambda hh, rest: f"/{hh.upper()}{rest}" if hh.upper() != hh else f"/{hh}0{rest}",
        lambda hh, rest: f"/{hh}/..{rest}",  # `..`
        lambda hh, rest: f"/{hh}/x{rest}",  # extra `/`
        lambda hh, rest: f"/{hh}{rest}1",  # other length
    ],
    ids=["wrong-hash", "uppercase", "dotdot", "extra-slash", "length"],
)
def test_hostile_names_are_refused_naming_file_and_entry(tmp_path, mangle) -> None:
    p = tmp_path / "ck"
    sp.save_file({"a": np.arange(3)}, p, shards=1, hashed_prefixes=True)
    idx = bytearray((tmp_path / "ck.index").read_bytes())
    shards_off = struct.unpack_from("<Q", idx, 40)[0]
    n = struct.unpack_from("<I", idx, shards_off + 20)[0]
    name = bytes(idx[shards_off + 24 : shards_off + 24 + n]).decode()
    bad = mangle(name[1:3], name[3:]).encode()
    assert len(bad) <= 40
    idx[shards_off + 20 : shards_off + 64] = struct.pack("<I", len(bad)) + bad.ljust(40, b"\0")
    # reseal: shard table crc (112), header crc (124) and its copy in the footer
    idx[112:116] = struct.pack("<I", crc32c(bytes(idx[shards_off : shards_off + 64])))
    idx[124:128] = struct.pack("<I", crc32c(bytes(idx[:124])))
    idx[-8:-4] = idx[124:128]
    (tmp_path / "ck.index").write_bytes(bytes(idx))
    with pytest.raises(CorruptCheckpointError) as e:
        sp.load_file(p)
    assert "ck.index" in str(e.value) and "shard record 0" in str(e.value), e.value
    with pytest.raises(rr.FormatError, match="shard record 0: refused name"):
        rr.read_checkpoint(p)


def test_a_hashed_name_in_a_version_1_index_is_refused(tmp_path) -> None:
    p = tmp_path / "ck"
    sp.save_file({"a": np.arange(3)}, p, shards=1, hashed_prefixes=True)
    idx = bytearray((tmp_path / "ck.index").read_bytes())
    idx[8:12] = struct.pack("<I", 1)
    idx[124:128] = struct.pack("<I", crc32c(bytes(idx[:124])))
    idx[-8:-4] = idx[124:128]
    (tmp_path / "ck.index").write_bytes(bytes(idx))
    with pytest.raises(CorruptCheckpointError, match="needs version 2"):
        sp.load_file(p)
    with pytest.raises(rr.FormatError, match="refused name"):
        rr.read_checkpoint(p)


def test_checkpoint_manager_saves_rotates_and_restores(tmp_path) -> None:
    v = sp.Variable(np.zeros(4, np.float32))
    ck = sp.Checkpoint(v=v)
    m = sp.CheckpointManager(ck, tmp_path, max_to_keep=1, hashed_prefixes=True)
    for step in (1, 2, 3):
        v.assign(np.full(4, step, np.float32))
        m.save()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-3", "ckpt-3.index"]
    assert _index_version(tmp_path / "ckpt-3") == 2
    v.assign(np.zeros(4, np.float32))
    ck.restore(m.latest_checkpoint).assert_consumed()
    np.testing.assert_array_equal(v.numpy(), np.full(4, 3, np.float32))
