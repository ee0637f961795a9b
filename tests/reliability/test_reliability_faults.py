"""Faults (issue 7, part 2): a full disk, read errors, read-only and missing directories, shards
deleted or replaced under a committed index. Each must give a clear error (the right exception
class, a message naming the file), leave the previous checkpoint intact, and leave no partial
file that looks like a checkpoint.

A full disk is a size-limited tmpfs when this process may mount one (root in a container that
allows it); otherwise ``RLIMIT_FSIZE`` in a child process with SIGXFSZ ignored (writes past the
limit fail with EFBIG, which exercises the same error paths).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest

import shardpoint as sp

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
FAULTS: dict[str, int] = {}


def _count(kind: str) -> None:
    FAULTS[kind] = FAULTS.get(kind, 0) + 1


def _noise(n: int, seed: int = 0) -> np.ndarray:
    """Incompressible bytes: compression cannot make a full disk fit."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True
    )
    return r.returncode == 0


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


@pytest.fixture
def small_fs(tmp_path) -> Iterator[str | None]:
    """A 2 MiB filesystem, or None when mounting is not allowed here."""
    mnt = str(tmp_path / "small")
    # SHARDPOINT_FAULTS_NO_MOUNT=1 forces the RLIMIT_FSIZE fallback (what CI without mount runs)
    if os.environ.get("SHARDPOINT_FAULTS_NO_MOUNT") or not _mount_tmpfs(mnt, "2m"):
        yield None
        return
    try:
        yield mnt
    finally:
        _umount(mnt)


def _names(d: str) -> set[str]:
    return set(os.listdir(d))


def _assert_no_partial_checkpoint(d: str, allowed_indexes: set[str]) -> None:
    """Only the indexes of intact checkpoints exist; no temp files stay behind."""
    names = _names(d)
    assert not {n for n in names if ".tmp-" in n or ".part-" in n}, names
    assert {n for n in names if n.endswith(".index")} == allowed_indexes, names
    for n in allowed_indexes:
        with sp.open(os.path.join(d, n[: -len(".index")])) as r:
            r.verify()


# ---- full disk -----------------------------------------------------------------------------

_FSIZE_CHILD = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    import numpy as np
    import shardpoint as sp
    d = sys.argv[1]
    small = {"x": np.arange(1000, dtype=np.float32)}
    sp.save_file(small, d + "/ck")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    big = {"x": np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)}
    out = {}
    for what in ("save_file", "manager"):
        try:
            if what == "save_file":
                sp.save_file(big, d + "/ck")
            else:
                v = sp.Variable(big["x"])
                sp.CheckpointManager(sp.Checkpoint(v=v), d + "/mgr", max_to_keep=2).save()
            out[what] = ["ok", ""]
        except Exception as e:
            out[what] = [type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__]]
    print(json.dumps(out))
    """
)


def test_full_disk(tmp_path, small_fs: str | None) -> None:
    """A save that runs out of space raises CheckpointIOError (an OSError) naming the file;
    the previous checkpoint at the same prefix reads back unchanged; nothing partial remains."""
    if small_fs is None:
        d = str(tmp_path)
        proc = subprocess.run(
            [sys.executable, "-c", _FSIZE_CHILD, d], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        for what, (cls, msg, *mro) in out.items():
            assert cls == "CheckpointIOError", (what, cls, msg)
            assert "OSError" in mro[0], mro
            assert d in msg and "File too large" in msg, msg
            _count(f"full_disk_{what}")
        assert np.array_equal(sp.load_file(d + "/ck")["x"], np.arange(1000, dtype=np.float32))
        _assert_no_partial_checkpoint(d, {"ck.index"})
        return
    d = small_fs
    prev = {"x": np.arange(1000, dtype=np.float32)}
    sp.save_file(prev, d + "/ck")
    for compression in ("none", "zstd"):
        with pytest.raises(sp.CheckpointError) as ei:
            sp.save_file({"x": _noise(3 << 20)}, d + "/ck", compression=compression)
        _count("full_disk_save_file")
        assert isinstance(ei.value, OSError) and type(ei.value).__name__ == "CheckpointIOError"
        assert d in str(ei.value) and "No space left" in str(ei.value), str(ei.value)
        assert np.array_equal(sp.load_file(d + "/ck")["x"], prev["x"])
        _assert_no_partial_checkpoint(d, {"ck.index"})
    # streaming writer: the error comes from add() or commit(); abort leaves nothing
    w = sp.Writer(d + "/ck")
    with pytest.raises(sp.CheckpointError):
        for i in range(8):
            w.add(f"k{i}", _noise(1 << 19, i))
        w.commit()
    w.abort()
    _count("full_disk_writer")
    _assert_no_partial_checkpoint(d, {"ck.index"})
    # the manager: the failed save leaves latest_checkpoint and the state file as they were
    v = sp.Variable(np.zeros(10, np.float32))
    mgr = sp.CheckpointManager(sp.Checkpoint(v=v), d + "/mgr", max_to_keep=2)
    first = mgr.save()
    v.assign(np.ones(10, np.float32))
    big = sp.Variable(_noise(3 << 20))
    mgr2 = sp.CheckpointManager(sp.Checkpoint(v=v, big=big), d + "/mgr", max_to_keep=2)
    with pytest.raises(OSError):
        mgr2.save()
    _count("full_disk_manager")
    assert sp.latest_checkpoint(d + "/mgr") == first
    _assert_no_partial_checkpoint(d + "/mgr", {os.path.basename(first) + ".index"})
    # space freed: saving works again
    sp.remove(d + "/ck")
    sp.save_file({"x": _noise(1 << 20)}, d + "/ck", compression="none")


# ---- read-only and missing directories -----------------------------------------------------


def test_read_only_directory(tmp_path) -> None:
    d = str(tmp_path / "ro")
    root = os.geteuid() == 0
    mounted = root and _mount_tmpfs(d, "4m")
    try:
        if not mounted:
            os.makedirs(d, exist_ok=True)
        sp.save_file({"x": np.arange(10)}, d + "/ck")
        if mounted:
            r = subprocess.run(["mount", "-o", "remount,ro", d], capture_output=True)
            assert r.returncode == 0, r.stderr
        elif root:
            pytest.skip("root without mount: permission bits do not apply")
        else:
            os.chmod(d, 0o555)
        with pytest.raises(sp.CheckpointError) as ei:
            sp.save_file({"x": np.arange(20)}, d + "/ck")
        _count("read_only_dir")
        assert isinstance(ei.value, OSError) and d in str(ei.value), str(ei.value)
        with pytest.raises(OSError):
            sp.remove(d + "/ck")
        assert np.array_equal(sp.load_file(d + "/ck")["x"], np.arange(10))
        _assert_no_partial_checkpoint(d, {"ck.index"})
    finally:
        if mounted:
            _umount(d)
        elif os.path.isdir(d):
            os.chmod(d, 0o755)


def test_missing_directory(tmp_path) -> None:
    """Reads under a directory that does not exist raise NotFoundError naming the path; saves
    create the missing parents (issue 22, as TensorFlow's Checkpoint.save and Orbax do)."""
    missing = str(tmp_path / "no" / "such" / "dir" / "ck")
    with pytest.raises(sp.NotFoundError) as ei:
        sp.open(missing)
    assert isinstance(ei.value, FileNotFoundError) and str(tmp_path) in str(ei.value)
    with pytest.raises(sp.NotFoundError):
        sp.load_file(missing)
    with pytest.raises(sp.NotFoundError):
        sp.merge(missing, 2)
    assert sp.latest_checkpoint(os.path.dirname(missing)) is None
    sp.save_file({"x": np.arange(3)}, missing)
    assert np.array_equal(sp.load_file(missing)["x"], np.arange(3))
    other = str(tmp_path / "other" / "dir" / "ck")
    with sp.Writer(other) as w:
        w.add("y", np.ones(2))
    assert np.array_equal(sp.load_file(other)["y"], np.ones(2))
    _count("missing_dir")


# ---- read errors and shards changed under a committed index --------------------------------


def _ckpt(tmp_path, name: str = "ck", seed: int = 0) -> tuple[str, str]:
    p = str(tmp_path / name)
    sp.save_file({"x": np.full(5000, seed, np.float32)}, p, compression="none")
    return p, p + ".data-00000-of-00001"


def _open_and_read(prefix: str) -> None:
    with sp.open(prefix) as r:
        r.load()
        r.verify()


def test_shard_replaced_by_directory(tmp_path) -> None:
    p, shard = _ckpt(tmp_path)
    os.unlink(shard)
    os.mkdir(shard)
    with pytest.raises(sp.CheckpointError) as ei:
        _open_and_read(p)
    _count("shard_is_directory")
    assert shard in str(ei.value), str(ei.value)
    assert isinstance(ei.value, OSError | ValueError)


def test_index_replaced_by_directory(tmp_path) -> None:
    p, _ = _ckpt(tmp_path)
    os.unlink(p + ".index")
    os.mkdir(p + ".index")
    with pytest.raises(sp.CheckpointError) as ei:
        _open_and_read(p)
    _count("index_is_directory")
    assert p + ".index" in str(ei.value)


def test_shard_is_dangling_symlink(tmp_path) -> None:
    p, shard = _ckpt(tmp_path)
    os.unlink(shard)
    os.symlink(str(tmp_path / "nowhere"), shard)
    with pytest.raises(sp.NotFoundError) as ei:
        _open_and_read(p)
    _count("shard_dangling_symlink")
    assert shard in str(ei.value)


def test_unreadable_shard(tmp_path) -> None:
    """EACCES on open. Root ignores permission bits, so there the test drops to an unprivileged
    uid in a child process (when it can) instead of skipping."""
    # a world-traversable directory: pytest's tmp root is 0700, which nobody cannot enter
    base = tempfile.mkdtemp(prefix="sp-unreadable-")
    os.chmod(base, 0o755)
    p, shard = _ckpt(pathlib.Path(base))
    os.chmod(p + ".index", 0o644)
    os.chmod(shard, 0)
    code = (
        "import os, sys, shardpoint as sp\n"
        "if os.geteuid() == 0: os.setgid(65534); os.setuid(65534)\n"
        "try:\n    sp.load_file(sys.argv[1])\n    print('ok')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code, p], capture_output=True, text=True)
    finally:
        shutil.rmtree(base)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip()
    _count("shard_unreadable")
    assert out.startswith("CheckpointIOError") and shard in out and "ermission" in out, out


def test_shard_replaced_by_fifo_does_not_hang(tmp_path) -> None:
    """A FIFO named like a shard (a hostile or broken directory): opening it for reading
    blocks until a writer appears. The reader must refuse it, not hang forever."""
    p, shard = _ckpt(tmp_path)
    os.unlink(shard)
    os.mkfifo(shard)
    code = (
        "import sys, shardpoint as sp\n"
        "try:\n    sp.load_file(sys.argv[1])\n    print('ok')\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, p], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:  # subprocess.run has killed the hung child
        pytest.fail(f"opening a checkpoint whose shard {shard} is a FIFO hangs")
    _count("shard_is_fifo")
    out = proc.stdout.strip()
    assert out.split()[0] in ("CorruptCheckpointError", "CheckpointIOError"), out
    assert shard in out, out


def test_shard_deleted_under_manager(tmp_path) -> None:
    """latest_checkpoint names a checkpoint whose shard was deleted by someone else: restoring
    raises NotFoundError naming the shard; the other checkpoints are unaffected."""
    v = sp.Variable(np.zeros(100, np.float32))
    mgr = sp.CheckpointManager(sp.Checkpoint(v=v), str(tmp_path), max_to_keep=3)
    paths = []
    for i in range(3):
        v.assign(np.full(100, i, np.float32))
        paths.append(mgr.save())
    shard = paths[-1] + ".data-00000-of-00001"
    os.unlink(shard)
    ck = sp.Checkpoint(v=sp.Variable(np.zeros(100, np.float32)))
    with pytest.raises(sp.NotFoundError) as ei:
        ck.restore(sp.latest_checkpoint(str(tmp_path)))
    assert shard in str(ei.value)
    ck.restore(paths[-2]).assert_consumed()
    assert float(ck.v.numpy()[0]) == 1.0
    _count("shard_deleted")


def test_shard_swapped_from_another_save(tmp_path) -> None:
    """A shard replaced by one of the same name and size from another save is detected by its
    save token before any byte of it is used."""
    p, shard = _ckpt(tmp_path, "a", seed=1)
    q, other = _ckpt(tmp_path, "b", seed=2)
    assert os.path.getsize(shard) == os.path.getsize(other)
    os.replace(other, shard)
    with pytest.raises(sp.CorruptCheckpointError) as ei:
        sp.open(p)
    assert shard in str(ei.value) and "another save" in str(ei.value)
    _count("shard_swapped")


def test_shard_replaced_while_open_keeps_reader_consistent(tmp_path) -> None:
    """Replacing a shard file (new inode) under an open reader does not change what the reader
    returns: it holds the old file's mapping."""
    p, shard = _ckpt(tmp_path, "a", seed=1)
    with sp.open(p) as r:
        first = r["x"].copy()
        tmp = shard + ".new"
        with open(shard, "rb") as f:
            data = bytearray(f.read())
        data[-4:] = b"\xff\xff\xff\xff"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, shard)
        assert np.array_equal(r.get("x", verify=True), first)
        r.verify()
    with pytest.raises(sp.ChecksumMismatchError):
        sp.load_file(p)
    _count("shard_replaced_while_open")
