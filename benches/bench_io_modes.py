"""I/O-mode benchmark (issue 25): ``io="mmap" | "pread" | "auto"`` on a network-style file
system (FUSE sshfs) beside the same loads from local disk, cold and warm.

Not a test: it prints every measurement and one table per case, with ratios, from one run.

    .venv/bin/python benches/bench_io_modes.py [--mount DIR --backing DIR] [--rounds 3]
        [--scale 0.5] [--small 10000] [--fuse sshfs|rclone-http] [--latency-ms 0]
        [--sshfs-opts kernel_cache]
        [--only a,b] [--modes cold,warm]

File systems: ``local`` (a directory on the local disk) and ``fuse`` (a FUSE mount). Without
``--mount`` the bench mounts one itself (root, ``sshfs`` and ``sshd`` needed: ``make
bench-deps`` installs them): a private ``sshd`` on 127.0.0.1 with a throw-away key, and
``sshfs`` of a directory on the same local disk, so that ``local`` and ``fuse`` read the
same device and differ only by the file-system path (every FUSE read, and every page fault of
a mapping, is an SFTP round trip through ssh). ``--latency-ms X`` puts a relay in front of
sshd that delays every chunk by X ms each way (the kernel has no ``netem`` here), as a network
would; ``--sshfs-opts kernel_cache`` keeps the client's page cache across opens, as an NFS
client does (sshfs' default drops it at every open). ``--fuse rclone-http`` mounts an
object-store-like file system instead: ``rclone serve http`` of the directory and ``rclone
mount`` of that (every read an HTTP range GET, no cache). It unmounts and stops its servers at
the end.

Cases: ``big`` (the MiniLM-valued bf16 transformer state dict of benches/bench_load.py at
``--scale``, 313 tensors) and ``small`` (``--small`` float32 tensors of 0.25-16 KiB cut from
the same weights). Each is saved as shardpoint (``compression="none"``: the zero-copy case the
io mode is about) and safetensors (the anchor), once on each file system.

Loaders (each run a fresh process; the clock covers open + read until every byte is in memory,
every page of every value touched): ``sp.load_file``, ``sp.open(...)[key]`` for every key (in
file order, and shuffled: a model whose parameter order is not the file's) and ``sptorch.load``
with each io mode, ``sptorch.load_into`` (always ``pread``) into existing,
pre-faulted tensors, and ``safetensors.torch.load_file``. Rounds interleave everything.
"cold": ``echo 3 > /proc/sys/vm/drop_caches`` just before the process (the server side, here
the same kernel, is cold too); without root, ``posix_fadvise(DONTNEED)`` of the files.
"warm": the files read through the measured path just before (a FUSE mount without
``kernel_cache``, sshfs' default, drops its own page cache at every open: there "warm" means
the server's cache is warm, every byte still crosses the protocol).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GB = 1e9
MODES = ("mmap", "pread", "auto")


# --- the checkpoints --------------------------------------------------------------------------
def small_state(n: int) -> dict[str, Any]:
    """``n`` float32 tensors of 0.25-16 KiB, their values cut from the MiniLM weights."""
    import torch

    from bench_load import minilm_tensors

    flat = torch.cat([t.float().flatten() for t in minilm_tensors().values()])
    gen = torch.Generator().manual_seed(25)
    sizes = torch.randint(64, 4096, (n,), generator=gen).tolist()
    out, pos = {}, 0
    for i, s in enumerate(sizes):
        if pos + s > flat.numel():
            pos = 0
        out[f"block.{i // 100}.param.{i % 100}"] = flat[pos : pos + s].clone()
        pos += s
    return out


def write_case(dst: Path, state: dict[str, Any]) -> None:
    """``dst/sp`` (shardpoint, uncompressed) and ``dst/model.safetensors``."""
    from safetensors.torch import save_file

    import shardpoint.torch as spt

    dst.mkdir(parents=True, exist_ok=True)
    spt.save(state, str(dst / "sp"), compression="none")
    save_file(state, str(dst / "model.safetensors"))


def case_files(d: Path) -> list[str]:
    """Every file a loader of case directory ``d`` reads."""
    return sorted(str(p) for p in d.rglob("*") if p.is_file())


def setup(args: argparse.Namespace) -> dict[str, int]:
    """Write each case once into ``<out>/local`` and copy it to the FUSE backing directory
    (unless present); returns each case's bytes of values."""
    from bench_load import make_state

    sizes = {}
    for case in args.cases:
        src = args.out / "local" / case
        if not (src / "DONE").exists():
            shutil.rmtree(src, ignore_errors=True)
            state = make_state(args.scale) if case == "big" else small_state(args.small)
            write_case(src, state)
            (src / "BYTES").write_text(
                str(sum(t.numel() * t.element_size() for t in state.values()))
            )
            (src / "COUNT").write_text(str(len(state)))
            del state
            (src / "DONE").write_text("ok")
        sizes[case] = int((src / "BYTES").read_text())
        dst = args.backing / case
        if not (dst / "DONE").exists():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
    os.sync()
    return sizes


# --- the FUSE mount ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def relay(port: int, delay: float) -> None:
    """ssh ProxyCommand: stdin/stdout <-> 127.0.0.1:port, every chunk delivered ``delay``
    seconds after it was read, in order (one-way latency; throughput unchanged)."""
    import queue

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pump(read: Callable[[], bytes], write: Callable[[bytes], Any]) -> None:
        q: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def sender() -> None:
            while True:
                due, data = q.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    os._exit(0)
                write(data)

        threading.Thread(target=sender, daemon=True).start()
        while True:
            data = read()
            q.put((time.monotonic() + delay, data))
            if not data:
                return

    def write_out(b: bytes) -> None:
        view = memoryview(b)
        while view:
            view = view[os.write(1, view) :]

    t = threading.Thread(target=pump, args=(lambda: sock.recv(1 << 18), write_out), daemon=True)
    t.start()
    pump(lambda: os.read(0, 1 << 18), sock.sendall)
    t.join()


class SshfsMount:
    """A private sshd on 127.0.0.1 and an sshfs mount of ``backing`` at ``mount``."""

    def __init__(self, backing: Path, mount: Path, latency_ms: float, extra: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sp-sshfs-"))
        self.mount = mount
        self.backing = backing
        self.sshd: subprocess.Popen[bytes] | None = None
        key, host = self.dir / "key", self.dir / "hostkey"
        for k in (key, host):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)],
                check=True,
            )
        (self.dir / "authorized_keys").write_text((self.dir / "key.pub").read_text())
        self.port = _free_port()
        conf = self.dir / "sshd_config"
        conf.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host}\n"
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\n"
            "UsePAM no\nSubsystem sftp internal-sftp\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        self.sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(conf), "-e"])
        time.sleep(0.5)
        mount.mkdir(parents=True, exist_ok=True)
        opts = [
            f"IdentityFile={key}",
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "LogLevel=ERROR",
        ]
        if latency_ms > 0:
            proxy = f"{sys.executable} {Path(__file__).resolve()} --relay {self.port} {latency_ms}"
            opts.append(f"ProxyCommand={proxy}")
        opts += extra
        cmd = ["sshfs", "-p", str(self.port), f"root@127.0.0.1:{backing}", str(mount)]
        for o in opts:
            cmd += ["-o", o]
        subprocess.run(cmd, check=True)

    def close(self) -> None:
        """Unmount, stop sshd (by its pid), remove the keys."""
        subprocess.run(["fusermount", "-u", str(self.mount)], check=False)
        if self.sshd is not None:
            self.sshd.send_signal(signal.SIGTERM)
            self.sshd.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class RcloneHttpMount:
    """``rclone serve http`` of ``backing`` on 127.0.0.1 and ``rclone mount`` of it at
    ``mount``: an object-store-like FUSE file system (every read is an HTTP range GET; no
    local cache, ``--vfs-cache-mode off``)."""

    def __init__(self, backing: Path, mount: Path) -> None:
        self.mount = mount
        port = _free_port()
        self.server = subprocess.Popen(
            ["rclone", "serve", "http", str(backing), "--addr", f"127.0.0.1:{port}", "-q"]
        )
        time.sleep(1.0)
        mount.mkdir(parents=True, exist_ok=True)
        self.client = subprocess.Popen(
            ["rclone", "mount", ":http:", str(mount), "--http-url", f"http://127.0.0.1:{port}/"]
            + ["--read-only", "--vfs-cache-mode", "off", "-q"]
        )
        for _ in range(100):
            if os.path.ismount(mount):
                break
            time.sleep(0.1)
        else:
            self.close()
            raise SystemExit("rclone mount did not come up")

    def close(self) -> None:
        """Unmount, then stop the mount and the server (by their pids)."""
        subprocess.run(["fusermount", "-u", str(self.mount)], check=False)
        for p in (self.client, self.server):
            p.send_signal(signal.SIGTERM)
            p.wait(10)


# --- page cache -------------------------------------------------------------------------------
def evict(files: list[str]) -> str:
    """Drop caches before a cold run: the whole page cache when root can, else the files."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        from bench_load import evict as drop  # the tests' helper (tests/page_cache.py)

        drop(files)
        return "fadvise"


def warm(files: list[str]) -> None:
    """Read ``files`` whole, through the path the loader will use."""
    buf = bytearray(16 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def stream_rate(files: list[str]) -> float:
    """GB/s of reading ``files`` sequentially with 1 MiB reads (the path's own limit)."""
    t = time.perf_counter()
    n = 0
    buf = bytearray(1 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while k := fh.readinto(buf):
                n += k
    return n / GB / (time.perf_counter() - t)


# --- the child: one timed load in a fresh process ---------------------------------------------
def touch(values: Any) -> None:
    """Read one byte of every page of every array/tensor (a mapping's pages fault here)."""
    import numpy as np
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            if v.numel():
                v.reshape(-1).view(torch.uint8)[::4096].sum()
        elif isinstance(v, np.ndarray) and v.size:
            v.reshape(-1).view(np.uint8)[::4096].sum()


def loader(name: str, d: Path) -> Callable[[], None]:
    """The timed body of loader ``name`` on case directory ``d`` (imports happen here)."""
    import torch

    import shardpoint as sp
    import shardpoint.torch as spt

    prefix = str(d / "sp")
    kind, _, io = name.partition(":")
    if kind == "load_file":
        return lambda: touch(sp.load_file(prefix, io=io).values())
    if kind == "open_getitem":

        def each() -> None:
            with sp.open(prefix, io=io) as r:
                touch(r[k] for k in r.keys())

        return each
    if kind == "open_shuffled":
        import random

        def shuffled() -> None:
            with sp.open(prefix, io=io) as r:
                keys = list(r.keys())
                random.Random(25).shuffle(keys)
                touch(r[k] for k in keys)

        return shuffled
    if kind == "torch_load":
        return lambda: touch(spt.load(prefix, io=io).values())
    if kind == "load_into":
        with sp.open(prefix) as r:
            infos = {k: r.info(k) for k in r.keys()}
        dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
        targets = {k: torch.ones(i.shape, dtype=dtypes[i.dtype]) for k, i in infos.items()}

        def into() -> None:
            spt.load_into(targets, prefix)

        return into
    if kind == "safetensors":
        from safetensors.torch import load_file

        return lambda: touch(load_file(str(d / "model.safetensors")).values())
    raise SystemExit(f"unknown loader {name}")


def child(name: str, d: Path) -> None:
    """Run one timed load; print seconds, major faults, CPU seconds and what ``io="auto"``
    picks for these files now (JSON, last line)."""
    from shardpoint.storage.io_mode import resolve_io

    picked = resolve_io("auto", d / "sp", files=sorted(d.glob("sp.data-*")))
    body = loader(name, d)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    body()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    out = {"seconds": dt, "majflt": r1.ru_majflt - r0.ru_majflt, "cpu": cpu, "auto": picked}
    print(json.dumps(out))


def run_child(name: str, d: Path) -> dict[str, Any]:
    """One fresh process timing loader ``name`` on ``d``."""
    r = subprocess.run(
        [sys.executable, __file__, "--child", name, "--dir", str(d)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


LOADERS = (
    [f"load_file:{m}" for m in MODES]
    + [f"open_getitem:{m}" for m in MODES]
    + [f"open_shuffled:{m}" for m in MODES]
    + [f"torch_load:{m}" for m in MODES]
    + ["load_into", "safetensors"]
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/spbench-io"))
    ap.add_argument("--mount", type=Path, default=None, help="an existing FUSE mount to use")
    ap.add_argument("--backing", type=Path, default=None, help="the directory under --mount")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.5, help="big case's hidden size factor")
    ap.add_argument("--small", type=int, default=10000, help="tensors in the small case")
    ap.add_argument("--cases", default="big,small")
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--fs", default="local,fuse")
    ap.add_argument("--only", default="", help="comma-separated loaders (default: all)")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay on the link")
    ap.add_argument(
        "--fuse",
        default="sshfs",
        choices=["sshfs", "rclone-http"],
        help="the FUSE file system to mount when --mount is not given",
    )
    ap.add_argument(
        "--sshfs-opts",
        default="",
        help="more sshfs -o options, comma-separated (kernel_cache: keep the client page cache)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--relay", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.relay:
        relay(int(args.relay[0]), float(args.relay[1]) / 1000)
        return
    if args.child:
        child(args.child, args.dir)
        return
    args.cases = args.cases.split(",")
    fss = args.fs.split(",")
    mount: SshfsMount | RcloneHttpMount | None = None
    if args.mount is None:
        args.backing = args.out / "remote"
        args.mount = args.out / "mnt"
    elif args.backing is None:
        ap.error("--mount needs --backing: the directory the mount shows (to write the files)")
    sizes = setup(args)
    if "fuse" in fss and not os.path.ismount(args.mount):
        if args.fuse == "rclone-http":
            if not shutil.which("rclone"):
                raise SystemExit("--fuse rclone-http needs rclone (apt-get install rclone)")
            mount = RcloneHttpMount(args.backing, args.mount)
        else:
            if os.geteuid() != 0 or not (shutil.which("sshfs") and Path("/usr/sbin/sshd").exists()):
                raise SystemExit("no FUSE mount: pass --mount/--backing, or run as root with sshfs")
            extra = [o for o in args.sshfs_opts.split(",") if o]
            mount = SshfsMount(args.backing, args.mount, args.latency_ms, extra)
    try:
        bench(args, fss, sizes)
    finally:
        if mount is not None:
            mount.close()


def bench(args: argparse.Namespace, fss: list[str], sizes: dict[str, int]) -> None:
    """The measurements, the tables and the ratios."""
    from shardpoint.storage.io_mode import fs_type, resolve_io

    roots = {"local": args.out / "local", "fuse": args.mount}
    names = [n for n in LOADERS if not args.only or n.split(":")[0] in args.only.split(",")]
    modes = args.modes.split(",")
    print(
        f"shardpoint io-mode benchmark; cpus={os.cpu_count()} load average={os.getloadavg()} "
        f"fuse={args.fuse}; latency={args.latency_ms} ms each way (sshfs); "
        f"sshfs options={args.sshfs_opts or 'default'}"
    )
    from bench_load import first_touch_rate

    print(f"  fresh-memory first touch: {first_touch_rate():.2f} GB/s (what pread's output costs)")
    for fs in fss:
        kind = fs_type(roots[fs])
        picked = resolve_io("auto", roots[fs] / args.cases[0] / "sp")
        print(f"  {fs}: {roots[fs]} is {kind}; io='auto' picks {picked}")
        if fs == "fuse":
            # with no files to look at (or files not cached), a FUSE mount means pread
            assert kind is not None and kind.startswith("fuse"), kind
            assert picked == "pread", f"auto picked {picked} on {kind}"
    for case in args.cases:
        count = int((args.out / "local" / case / "COUNT").read_text())
        print(f"  case {case}: {count} tensors, {sizes[case] / GB:.3f} GB of values")
        for fs in fss:
            files = case_files(roots[fs] / case)
            evict(files)
            cold = stream_rate(files)
            hot = stream_rate(files)
            print(
                f"    {fs} sequential read of the files (1 MiB): cold {cold:.2f}, warm {hot:.2f} GB/s"
            )
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    errors: dict[tuple[str, str, str, str], str] = {}
    how = ""
    for rnd in range(args.rounds):
        for case in args.cases:
            for mode in modes:
                for fs in fss:
                    d = roots[fs] / case
                    files = case_files(d)
                    for n in names:
                        if mode == "cold":
                            how = evict(files)
                        else:
                            warm(files)
                        res = run_child(n, d)
                        key = (case, mode, fs, n)
                        if "error" in res:
                            errors[key] = res["error"]
                            print(
                                f"  {case} {mode} {fs} {n}: ERROR {res['error']}",
                                flush=True,
                            )
                            continue
                        res["rate"] = sizes[case] / GB / res["seconds"]
                        results.setdefault(key, []).append(res)
                        print(
                            f"  {case} {mode} {fs} {n}: {res['rate']:.3f} GB/s "
                            f"({res['seconds'] * 1e3:.0f} ms, {res['majflt']} major faults, "
                            f"{res['cpu']:.2f} CPU-s; auto would pick {res['auto']})",
                            flush=True,
                        )
        print(
            f"round {rnd + 1}/{args.rounds} done; load average={os.getloadavg()}",
            flush=True,
        )
    print(f"\ncold = {how}; best of {args.rounds} rounds (median), GB/s of values")

    def best(case: str, mode: str, fs: str, n: str) -> float:
        return max((r["rate"] for r in results.get((case, mode, fs, n), [])), default=0.0)

    def cell(case: str, mode: str, fs: str, n: str) -> str:
        r = results.get((case, mode, fs, n))
        if not r:
            return "n/a"
        rates = [x["rate"] for x in r]
        return f"{max(rates):.3f} ({statistics.median(rates):.3f})"

    for case in args.cases:
        print(f"\n{case}:")
        cols = [(m, fs) for m in modes for fs in fss]
        print("| loader | " + " | ".join(f"{m} {fs}" for m, fs in cols) + " |")
        print("|---|" + "---|" * len(cols))
        for n in names:
            print(f"| {n} | " + " | ".join(cell(case, m, fs, n) for m, fs in cols) + " |")
        print("ratios (best of rounds):")
        for m in modes:
            for fs in fss:
                for kind in ("load_file", "open_getitem", "open_shuffled", "torch_load"):
                    a, b = (
                        best(case, m, fs, f"{kind}:pread"),
                        best(case, m, fs, f"{kind}:mmap"),
                    )
                    if a and b:
                        print(f"  {case} {m} {fs} {kind}: pread / mmap = {a / b:.2f}")
                s = best(case, m, fs, "safetensors")
                for n in ("load_file:auto", "torch_load:auto", "load_into"):
                    if s and best(case, m, fs, n):
                        print(
                            f"  {case} {m} {fs} {n} / safetensors = {best(case, m, fs, n) / s:.2f}"
                        )
            if "local" in fss and "fuse" in fss:
                for n in names:
                    a, b = best(case, m, "fuse", n), best(case, m, "local", n)
                    if a and b:
                        print(f"  {case} {m} {n}: fuse / local = {a / b:.2f}")
    print(f"load average at the end={os.getloadavg()}")


if __name__ == "__main__":
    main()
