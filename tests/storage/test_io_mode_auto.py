"""``io="auto"`` picks by file-system type (issue 25): ``pread`` on FUSE and network mounts,
``mmap`` on local ones. The mount table is real kernel text (lines as /proc/self/mountinfo
prints them, taken from a machine with an sshfs, an s3fs and an NFS mount), written to a file
and passed as ``mountinfo=``; the process's own mounts (tmpfs, the test's directory) are
checked against /proc/self/mountinfo itself."""

from __future__ import annotations

import os

import pytest

from page_cache import evict
from shardpoint.storage.io_mode import (
    CACHED_ENOUGH,
    MOUNTINFO,
    cached_fraction,
    fs_type,
    resolve_io,
)

# (mount point under the test's directory, the line's tail after " - ", expected io)
MOUNTS = [
    ("", "ext4 /dev/vda rw,discard", "mmap"),
    ("sshfs", "fuse.sshfs root@127.0.0.1:/tmp/h25n/remote rw,user_id=0,group_id=0", "pread"),
    ("s3", "fuse.s3fs s3fs rw,nosuid,nodev,relatime,user_id=0,group_id=0", "pread"),
    ("nfs", "nfs4 10.0.0.2:/export rw,vers=4.2,rsize=1048576,proto=tcp", "pread"),
    ("overlay", "overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w", "mmap"),
    ("shm", "tmpfs tmpfs rw,size=24684084k", "mmap"),
    ("with space", "fuse.rclone remote: rw,user_id=0,group_id=0", "pread"),
    ("sshfs/local", "ext4 /dev/vdb rw,relatime", "mmap"),  # a local mount inside a FUSE one
]


def _escape(path: str) -> str:
    """A path as mountinfo writes it (space, tab, newline and backslash as octal)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@pytest.fixture
def table(tmp_path):
    """A mountinfo file whose mount points live under ``tmp_path``; returns (file, root)."""
    root = os.path.realpath(tmp_path)
    lines = ["27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard"]
    for i, (sub, tail, _) in enumerate(MOUNTS):
        point = os.path.join(root, sub) if sub else root
        lines.append(f"{40 + i} 27 0:{39 + i} / {_escape(point)} rw,relatime shared:1 - {tail}")
    f = tmp_path / "mountinfo"
    f.write_text("\n".join(lines) + "\n")
    return f, root


@pytest.mark.parametrize(("sub", "tail", "want"), MOUNTS)
def test_auto_picks_by_mount_type(table, sub, tail, want):
    f, root = table
    ck = os.path.join(root, sub, "run", "ckpt")
    assert fs_type(os.path.dirname(ck), mountinfo=f) == tail.split()[0]
    assert resolve_io("auto", ck, mountinfo=f) == want
    # explicit modes are taken as given, whatever the mount
    assert resolve_io("mmap", ck, mountinfo=f) == "mmap"
    assert resolve_io("pread", ck, mountinfo=f) == "pread"


def test_prefix_of_a_mount_name_is_not_inside_it(table):
    f, root = table
    # "<root>/sshfs2" is not under the sshfs mount "<root>/sshfs": the ext4 root holds it
    assert fs_type(os.path.join(root, "sshfs2"), mountinfo=f) == "ext4"
    assert resolve_io("auto", os.path.join(root, "sshfs2", "ck"), mountinfo=f) == "mmap"


def test_unreadable_table_means_mmap(tmp_path):
    missing = tmp_path / "no-such-mountinfo"
    assert fs_type(tmp_path, mountinfo=missing) is None
    assert resolve_io("auto", tmp_path / "ck", mountinfo=missing) == "mmap"


def test_real_mounts_of_this_process():
    # /dev/shm is a tmpfs on Linux (containers included): local memory, mapping is the cheap
    # path; /proc/self/mountinfo is read by default
    assert fs_type("/dev/shm") == "tmpfs"
    assert fs_type("/dev/shm", mountinfo=MOUNTINFO) == "tmpfs"
    assert resolve_io("auto", "/dev/shm/ck") == "mmap"
    assert fs_type("/proc/self") == "proc"


def test_auto_choice_is_cached_per_device_and_dropped_when_mounts_change(tmp_path):
    # resolve_io remembers its choice per device (parsing mountinfo costs more than an open);
    # a change to the mount table (here: a real tmpfs mounted and unmounted) drops the cache,
    # since device numbers are reused by later mounts
    import subprocess

    from shardpoint.storage import io_mode

    first = resolve_io("auto", tmp_path / "ck")
    dev = os.stat(tmp_path).st_dev
    assert io_mode._AUTO_BY_DEV[dev] == first
    # a stale entry stands in for a reused device number of another file-system type
    stale = "pread" if first == "mmap" else "mmap"
    io_mode._AUTO_BY_DEV[dev] = stale
    assert resolve_io("auto", tmp_path / "ck") == stale  # answered from the cache
    point = tmp_path / "mnt"
    point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "none", str(point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"this test needs to mount a tmpfs (root): {mounted.stderr!r}")
    subprocess.run(["umount", str(point)], check=True)
    assert resolve_io("auto", tmp_path / "ck") == first  # re-read after the change
    assert io_mode._AUTO_BY_DEV == {dev: first}


# --- page-cache residency: a network mount whose client keeps pages cached ---------------------
def _sshfs_table(tmp_path, point):
    """A mountinfo file with an sshfs mount (the kernel's text) at ``point``."""
    f = tmp_path / "mountinfo-sshfs"
    f.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
        f"42 27 0:39 / {_escape(point)} rw,nosuid,nodev,relatime - fuse.sshfs "
        "root@127.0.0.1:/srv rw,user_id=0,group_id=0\n"
    )
    return f


def test_cached_files_on_a_network_mount_are_mapped(tmp_path):
    root = os.path.realpath(tmp_path)
    data = tmp_path / "ck.data"
    data.write_bytes(os.urandom(1 << 20))
    data.read_bytes()  # in the page cache now
    table = _sshfs_table(tmp_path, root)
    assert cached_fraction(data) == 1.0
    assert resolve_io("auto", tmp_path / "ck", files=[data], mountinfo=table) == "mmap"
    # without the files to look at, a network mount still means pread
    assert resolve_io("auto", tmp_path / "ck", mountinfo=table) == "pread"
    # a local mount is mapped whatever the cache holds
    local = tmp_path / "mountinfo-local"
    local.write_text("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n")
    assert resolve_io("auto", tmp_path / "ck", files=[data], mountinfo=local) == "mmap"


def test_evicted_files_on_a_network_mount_are_read(tmp_path):
    if fs_type(tmp_path) == "tmpfs":
        pytest.skip("tmpfs pages cannot leave memory: nothing to evict")
    root = os.path.realpath(tmp_path)
    data = tmp_path / "ck.data"
    data.write_bytes(os.urandom(1 << 20))
    evict(data)
    table = _sshfs_table(tmp_path, root)
    assert cached_fraction(data) < CACHED_ENOUGH
    assert resolve_io("auto", tmp_path / "ck", files=[data], mountinfo=table) == "pread"
    local = tmp_path / "mountinfo-local"
    local.write_text("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n")
    assert resolve_io("auto", tmp_path / "ck", files=[data], mountinfo=local) == "mmap"
    # one cached file is not enough: every file the load reads must be cached
    other = tmp_path / "other.data"
    other.write_bytes(b"x" * 4096)
    other.read_bytes()
    assert resolve_io("auto", tmp_path / "ck", files=[other, data], mountinfo=table) == "pread"


def test_cached_fraction_of_nothing(tmp_path):
    assert cached_fraction(tmp_path / "missing") == 0.0
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert cached_fraction(empty) == 0.0


def test_partly_cached_large_file_is_read(tmp_path):
    if fs_type(tmp_path) == "tmpfs":
        pytest.skip("tmpfs pages cannot leave memory: nothing to evict")
    data = tmp_path / "big.data"
    data.write_bytes(os.urandom(8 << 20))  # 2048 pages: sampled in windows
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.pread(fd, 8 << 20, 0)
        os.posix_fadvise(fd, 4 << 20, 4 << 20, os.POSIX_FADV_DONTNEED)  # the second half out
    finally:
        os.close(fd)
    assert 0.3 < cached_fraction(data) < 0.7
    table = _sshfs_table(tmp_path, os.path.realpath(tmp_path))
    assert resolve_io("auto", tmp_path / "ck", files=[data], mountinfo=table) == "pread"
    data.read_bytes()
    assert cached_fraction(data) == 1.0
    assert resolve_io("auto", tmp_path / "ck", files=[data], mountinfo=table) == "mmap"


def test_auto_from_many_threads_at_once(tmp_path):
    # the mount-table watch is shared: threads resolving at once must not collide in it (a
    # poll object raises "concurrent poll() invocation" when two threads poll it together)
    import threading

    want = resolve_io("auto", tmp_path / "ck")
    errors: list[BaseException] = []
    got: set[str] = set()

    def work() -> None:
        try:
            for _ in range(1500):
                got.add(resolve_io("auto", tmp_path / "ck"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert got == {want}
