"""Serving-load benchmark (issue 34): a ~1 GB bf16 model loaded into a model's parameters the
way a serving engine loads it (``(name, tensor)`` pairs, each copied into its parameter), over a
throttled link and from local disk, beside the engines' own loaders on the same files.

Not a test: it prints every measurement and a table of ratios from one run.

    .venv/bin/python benches/bench_serving.py [--out DIR] [--scale 1.0] [--rounds 2]
        [--link-mbps 1000] [--only a,b] [--cases link-s3,link-fuse,local-cold,local-warm]
        [--s3-server auto|fast|moto]

The state dict is benches/bench_load.py's (313 MiniLM-valued bf16 tensors, ~1.0 GB at scale 1),
written as a Hugging Face directory (one safetensors file), shardpoint uncompressed and
shardpoint with the default codec.

The link (this kernel has no netem/tbf): a relay process on 127.0.0.1 that passes bytes on at
most ``--link-mbps`` MB/s each way (a token bucket), in front of
- ``link-s3``: an S3 server in its own process holding every file (benches/s3server.py: ours,
  Rust, built on demand, ``--s3-server fast``; ``moto`` where cargo is missing or asked for);
  shardpoint reads ``s3://`` directly; the anchors are a plain download of the safetensors
  object into memory + ``safetensors.torch.load`` (safetensors eager, as deployments do it),
  boto3's parallel ranged download (``download_fileobj``, 8 threads) + load, and Run:ai Model
  Streamer reading ``s3://`` itself (``s3_runai``: runai-model-streamer-s3, AWS SDK for C++,
  parallel ranged GETs);
- ``link-fuse``: sshfs (a private sshd; every FUSE read an SFTP round trip) through the relay,
  every loader reading the mounted files: safetensors lazy (``safe_open`` + ``get_tensor`` per
  key) and eager (``load(open().read())``), Run:ai Model Streamer, fastsafetensors (CPU,
  ``nogds``), instanttensor when it imports, and ``sptorch.weights_iterator`` on the Hugging
  Face directory (``io="pread"``, the default ``direct="cold"``: the ``O_DIRECT`` cold-read
  engine when the file is mostly not cached; ``sp_hf_direct`` / ``sp_hf_buffered``: the route
  forced; ``sp_hf_auto``: both routes timed on the first values; ``sp_hf_mt``: the consumer's
  ``copy_`` on torch's whole OpenMP team, ``consumer_threads=None``) and on both shardpoint
  checkpoints (the same suffixes on ``sp_none`` and ``sp_default``).
``local-cold`` / ``local-warm``: the same file loaders on the local disk, page cache evicted
(``posix_fadvise(DONTNEED)``) or warmed first. With ``local-cold``, every round starts by
measuring the device limit (bench_load's ``fio --direct=1`` and buffered read), and each cold
loader's share of its round's limit is printed at the end.

Every run is a fresh process (the package compiled as a wheel's install has it): it builds the
model (pre-faulted), then times open + read + copy of every tensor into its parameter. The loader's peak host memory (the resident high-water
mark during the load over the resident set before it, the model included) is reported, and its
CPU seconds per GB (user and system, every thread: ``getrusage``) and minor faults. Rounds
interleave the loaders, each round starting one loader later; a row shows the best round and
the median, and each ratio also its per-round values (ours over the anchor in the same round)
and their median. shardpoint's rows also list the route each round read by.
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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from installed import compile_package  # noqa: E402

GB = 1e9
FILE_LOADERS = ["st_lazy", "st_eager", "runai", "fastsafetensors", "instanttensor", "sp_hf",
                "sp_hf_mt", "sp_hf_direct", "sp_hf_buffered", "sp_hf_auto", "sp_none",
                "sp_none_direct", "sp_none_buffered", "sp_none_auto", "sp_default",
                "sp_default_direct", "sp_default_buffered", "sp_default_auto"]  # fmt: skip
S3_LOADERS = ["s3_get_load", "s3_parallel_load", "s3_runai", "sp_none", "sp_default"]
#: where runai-model-streamer-s3's library is when it is not installed beside the streamer
#: (``pip install --no-deps --target ~/.cache/shardpoint/runai-s3 runai-model-streamer-s3``)
_RUNAI_S3_DEFAULT = "~/.cache/shardpoint/runai-s3/runai_model_streamer/libstreamer/lib"
RUNAI_S3_LIB = os.environ.get("SP_RUNAI_S3_LIB", os.path.expanduser(_RUNAI_S3_DEFAULT))


# --- the link: a rate-limited relay ------------------------------------------------------------
def throttle_serve(listen: int, target: int, rate: float) -> None:
    """Accept on 127.0.0.1:listen, connect each client to 127.0.0.1:target, pass bytes on at
    most ``rate`` bytes/s per direction (all connections share the budget, as one link)."""
    lock = threading.Lock()
    state = {"up": time.monotonic(), "down": time.monotonic()}

    def spend(direction: str, n: int) -> None:
        with lock:  # the time the link is busy with these bytes, shared by all connections
            start = max(state[direction], time.monotonic())
            state[direction] = start + n / rate
            due = state[direction]
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def pump(src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(1 << 16):
                spend(direction, len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    srv = socket.create_server(("127.0.0.1", listen), reuse_port=False)
    while True:
        c, _ = srv.accept()
        u = socket.create_connection(("127.0.0.1", target))
        for s in (c, u):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(c, u, "up"), daemon=True).start()
        threading.Thread(target=pump, args=(u, c, "down"), daemon=True).start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def throttled(target: int, rate: float) -> tuple[int, subprocess.Popen[bytes]]:
    port = free_port()
    p = start([sys.executable, __file__, "--throttle", str(port), str(target), str(rate)])
    wait_port(port)
    return port, p


# --- the checkpoints --------------------------------------------------------------------------
def setup(work: Path, scale: float) -> None:
    """hf/model.safetensors, sp_none, sp_default (written once per --out)."""
    if (work / "DONE").exists():
        return
    from safetensors.torch import save_file

    import shardpoint.torch as spt
    from bench_load import make_state

    shutil.rmtree(work, ignore_errors=True)
    (work / "hf").mkdir(parents=True)
    state = make_state(scale)
    save_file(state, str(work / "hf" / "model.safetensors"))
    spt.save(state, str(work / "sp_none"), compression="none")
    spt.save(state, str(work / "sp_default"))
    os.sync()
    (work / "DONE").write_text("ok")


def files_of(d: Path) -> list[str]:
    return sorted(str(p) for p in d.rglob("*") if p.is_file() and p.name != "DONE")


def evict(paths: list[str]) -> None:
    from bench_load import evict as drop  # the tests' helper (tests/page_cache.py)

    drop(paths)


def warm(paths: list[str]) -> None:
    for f in paths:
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


# --- loaders (each run in a fresh process) -----------------------------------------------------
def pairs(name: str, root: str, s3: dict[str, str] | None) -> Callable[[], Any]:
    """A function giving the (name, tensor) pairs of loader ``name`` reading under ``root``
    (a directory, or an s3:// URL prefix with ``s3`` storage options)."""
    st = os.path.join(root, "hf", "model.safetensors")
    if name == "st_lazy":
        from safetensors import safe_open

        def lazy() -> Any:
            with safe_open(st, framework="pt") as f:
                for k in f.keys():  # noqa: SIM118
                    yield k, f.get_tensor(k)

        return lazy
    if name == "st_eager":
        from safetensors.torch import load

        return lambda: load(open(st, "rb").read()).items()
    if name in ("runai", "s3_runai"):
        from runai_model_streamer import SafetensorsStreamer

        def runai() -> Any:
            with SafetensorsStreamer() as s:
                s.stream_file(st)
                yield from s.get_tensors()

        return runai
    if name == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        def fst() -> Any:
            ld = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
            ld.add_filenames({0: [st]})
            fb = ld.copy_files_to_device()
            for k in list(fb.key_to_rank_lidx):
                yield k, fb.get_tensor(k)
            fb.close()
            ld.close()

        return fst
    if name == "instanttensor":
        import instanttensor  # noqa: F401 - only where it installs and imports on CPU

        raise SystemExit("instanttensor: no CPU loading path")
    if name in ("s3_get_load", "s3_parallel_load"):
        import io

        import boto3
        from boto3.s3.transfer import TransferConfig
        from safetensors.torch import load

        assert s3 is not None
        bucket = root.split("/")[2]
        client = boto3.client("s3", endpoint_url=s3["endpoint"], aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip

        def get() -> Any:
            if name == "s3_get_load":
                body = client.get_object(Bucket=bucket, Key="hf/model.safetensors")["Body"].read()
            else:
                buf = io.BytesIO()
                cfg = TransferConfig(max_concurrency=8, multipart_chunksize=16 << 20)
                client.download_fileobj(bucket, "hf/model.safetensors", buf, Config=cfg)
                body = buf.getvalue()
            return load(body).items()

        return get
    import shardpoint.torch as spt

    sub = "hf" if name.startswith("sp_hf") else "_".join(name.split("_")[:2])  # sp_none_auto
    path = root.rstrip("/") + "/" + sub
    opts = None
    if s3 is not None:
        opts = {"endpoint": s3["endpoint"], "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing", "region": "us-east-1", "allow_http": "true"}  # fmt: skip
    # the cold-read engine (O_DIRECT) forced on or off, or direct="auto" (both routes timed on
    # the first values), docs/SERVING.md; plain rows: the default ("cold": direct when the
    # files are mostly not in the page cache)
    kw: dict[str, Any] = {}
    if name.endswith(("_direct", "_buffered")):
        kw["direct"] = name.endswith("_direct")
    elif name.endswith("_auto"):
        kw["direct"] = "auto"
    if name == "sp_hf_mt":
        # the consumer's copy_ on torch's whole OpenMP team, as before consumer_threads
        kw["consumer_threads"] = None
    return lambda: spt.weights_iterator(path, io="pread", storage_options=opts, **kw)


def _status_bytes(field: str) -> int:
    """A memory figure of /proc/self/status (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> int:
    """Reset the resident high-water mark to the current resident set; returns that set."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def child(name: str, root: str, scale: float, s3: dict[str, str] | None) -> None:
    import torch

    from bench_load import build_model

    get = pairs(name, root, s3)
    model = build_model(scale)
    params = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in params.values())
    largest = max(t.numel() * t.element_size() for t in params.values())
    # The loader's own memory: the resident high-water mark during the load over the resident
    # set just before it (the model included). ru_maxrss counts from process start, so an
    # import's transient peak could hide the load's and give negative figures; Linux resets the
    # high-water mark (VmHWM) on writing 5 to clear_refs.
    base = _reset_peak_rss()
    # CPU of the whole load, every thread of the process (the producer, the consumer's copies,
    # the kernel's page-cache work): steadier than GB/s on a shared machine (issue 41)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = 0
    it = get()
    with torch.no_grad():
        for k, v in it:
            params[k].copy_(v)
            n += 1
    route = getattr(it, "route", None)  # shardpoint's iterator: the route it read by
    probe = getattr(it, "probe_rates", None)  # direct="auto": what each route read at, GB/s
    if route and probe:
        route += " (" + "/".join(f"{k[0]} {v / GB:.2f}" for k, v in sorted(probe.items())) + ")"
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    peak = _status_bytes("VmHWM") - base
    ok = n == len(params) and not bool(torch.all(next(iter(params.values())) == 1))
    print(json.dumps({"seconds": dt, "bytes": nbytes, "ok": ok, "extra_rss": peak,
                      "largest": largest, "user": r1.ru_utime - r0.ru_utime,
                      "sys": r1.ru_stime - r0.ru_stime,
                      "faults": r1.ru_minflt - r0.ru_minflt, "route": route}))  # fmt: skip


def run_child(name: str, root: str, args: argparse.Namespace, s3: dict[str, str] | None) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--root", root, "--scale", str(args.scale)]
    env = None
    if s3 is not None:
        cmd += ["--s3", json.dumps(s3)]
        # for Run:ai's S3 client (the others take the endpoint as an argument)
        env = {**os.environ, "AWS_ENDPOINT_URL": s3["endpoint"], "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true",
               "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}  # fmt: skip
        if os.path.isdir(RUNAI_S3_LIB):
            env["LD_LIBRARY_PATH"] = ":".join(
                p for p in (RUNAI_S3_LIB, os.environ.get("LD_LIBRARY_PATH")) if p
            )
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:160]}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


# --- the cases --------------------------------------------------------------------------------
class Sshfs:
    """A private sshd and an sshfs mount of ``backing`` reached through the throttled relay."""

    def __init__(self, backing: Path, mount: Path, rate: float) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="sp-bench-sshfs-"))
        self.mount = mount
        key, host = self.dir / "key", self.dir / "hostkey"
        for k in (key, host):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True
            )
        (self.dir / "ak").write_text((self.dir / "key.pub").read_text())
        port = free_port()
        (self.dir / "conf").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nAuthorizedKeysFile "
            f"{self.dir / 'ak'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        self.sshd = start(["/usr/sbin/sshd", "-D", "-f", str(self.dir / "conf"), "-e"])
        wait_port(port)
        self.relay_port, self.relay = throttled(port, rate)
        mount.mkdir(parents=True, exist_ok=True)
        cmd = ["sshfs", "-p", str(self.relay_port), f"root@127.0.0.1:{backing}", str(mount)]
        for o in (f"IdentityFile={key}", "StrictHostKeyChecking=no",
                  "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"):  # fmt: skip
            cmd += ["-o", o]
        subprocess.run(cmd, check=True)

    def close(self) -> None:
        subprocess.run(["fusermount", "-u", str(self.mount)], check=False)
        for p in (self.relay, self.sshd):
            p.send_signal(signal.SIGTERM)
            p.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class S3:
    """An S3 server (its own process; benches/s3server.py) holding every file, behind the
    throttled relay."""

    def __init__(self, work: Path, rate: float, kind: str) -> None:
        from s3server import start as start_s3

        self.server = start_s3(kind)
        try:
            self.server.s3.create_bucket(Bucket="bench")
            for f in files_of(work):
                self.server.s3.upload_file(f, "bench", os.path.relpath(f, work))
        except BaseException:
            self.server.close()
            raise
        self.relay_port, self.relay = throttled(self.server.port, rate)
        self.opts = {"endpoint": f"http://127.0.0.1:{self.relay_port}"}

    def close(self) -> None:
        self.relay.send_signal(signal.SIGTERM)
        self.relay.wait(10)
        self.server.close()


def bench(args: argparse.Namespace) -> None:
    compile_package()  # benches/installed.py
    work = args.out / "data"
    setup(work, args.scale)
    rate = args.link_mbps * 1e6
    only = set(args.only.split(",")) if args.only else None
    results: dict[str, dict[str, list[dict]]] = {}

    def record(case: str, name: str, r: dict) -> None:
        results.setdefault(case, {}).setdefault(name, []).append(r)
        extra = "" if "error" in r else f"{r['bytes'] / r['seconds'] / GB:.2f} GB/s"
        print(f"  {case:11s} {name:17s} {r.get('error') or extra}", flush=True)

    cases = args.cases.split(",")
    limits: list[float] = []  # each round's device limit: max(fio O_DIRECT, buffered dd)
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}", flush=True)
        if "local-cold" in cases:
            from bench_load import device_limit

            lim = device_limit(str(work / "hf" / "model.safetensors"))
            limits.append(max(lim.values()))
            print("  device: " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in lim.items()))
        for case in cases:
            names = S3_LOADERS if case == "link-s3" else FILE_LOADERS
            names = [n for n in names if only is None or n in only]
            # each round starts one loader later: none always runs right after the device
            # probe, nor always after the same neighbour
            names = names[rnd % len(names) :] + names[: rnd % len(names)] if names else names
            if case == "link-s3":
                s3 = S3(work, rate, args.s3_server)
                try:
                    for n in names:
                        record(case, n, run_child(n, "s3://bench", args, s3.opts))
                finally:
                    s3.close()
                continue
            mount = None
            root = str(work)
            if case == "link-fuse":
                mount = Sshfs(work, args.out / "mnt", rate)
                root = str(args.out / "mnt")
            try:
                for n in names:
                    if case == "local-warm":
                        warm(files_of(work))
                    else:
                        evict(files_of(work))
                    record(case, n, run_child(n, root, args, None))
            finally:
                if mount is not None:
                    mount.close()
    report(results, args)
    device_share(results.get("local-cold", {}), limits)


def device_share(cold: dict[str, list[dict]], limits: list[float]) -> None:
    """Each loader's cold rate over the device limit measured in the same round (rounds
    whose load failed are left out): best and median of the per-round shares."""
    if not limits:
        return
    print("\nlocal-cold over the device limit of the same round (best (median))")
    for name, rs in cold.items():
        shares = [
            r["bytes"] / r["seconds"] / GB / lim
            for r, lim in zip(rs, limits, strict=False)
            if "error" not in r
        ]
        if shares:
            print(f"  {name:17s} {max(shares):.2f} ({statistics.median(shares):.2f})")


def report(results: dict[str, dict[str, list[dict]]], args: argparse.Namespace) -> None:
    def rate(case: str, name: str) -> tuple[float, float] | None:
        rs = [r for r in results.get(case, {}).get(name, []) if "error" not in r]
        if not rs:
            return None
        gbs = [r["bytes"] / r["seconds"] / GB for r in rs]
        return max(gbs), statistics.median(gbs)

    print(
        f"\nscale {args.scale}, link {args.link_mbps} MB/s (relay), best (median) GB/s of tensors"
    )
    for case, rows in results.items():
        print(f"\n{case}")
        for name, rs in rows.items():
            got = rate(case, name)
            if got is None:
                print(f"  {name:17s} {rs[0].get('error')}")
                continue
            mem = max(r["extra_rss"] for r in rs if "error" not in r) / 1e6
            big = rs[0]["largest"] / 1e6
            print(f"  {name:17s} {got[0]:6.2f} ({got[1]:.2f})  peak RSS over the model "
                  f"{mem:7.0f} MB (largest tensor {big:.0f} MB)")  # fmt: skip
            ok = [r for r in rs if "error" not in r and "user" in r]
            if ok:  # CPU-s per GB of tensors, medians over the rounds
                u = statistics.median(r["user"] / r["bytes"] * GB for r in ok)
                y = statistics.median(r["sys"] / r["bytes"] * GB for r in ok)
                f = statistics.median(r["faults"] for r in ok)
                print(f"  {'':17s} CPU-s/GB user {u:.3f} + sys {y:.3f} = {u + y:.3f}, "
                      f"{f:.0f} minor faults (medians)")  # fmt: skip
                routes = [r["route"] for r in ok if r.get("route")]
                if routes:  # shardpoint's rows: the route each round read by
                    print(f"  {'':17s} routes: " + ", ".join(routes))

    def ratio(case: str, ours: str, anchors: list[str]) -> None:
        a = rate(case, ours)
        others = [(n, rate(case, n)) for n in anchors]
        others = [(n, r) for n, r in others if r is not None]
        if a is None or not others:
            return
        n, b = max(others, key=lambda x: x[1][0])
        print(f"  {case}: {ours} / {n} = {a[0] / b[0]:.2f}x (medians {a[1] / b[1]:.2f}x)")
        # side by side: each round's ratio (every loader records one result per round, errors
        # included, so the lists line up); the machine's state moves between rounds more than
        # the loaders differ within one
        rows = results.get(case, {})
        per = []
        for i, r in enumerate(rows.get(ours, [])):
            got = [
                o[i]["bytes"] / o[i]["seconds"]
                for o in (rows.get(m, []) for m in anchors)
                if i < len(o) and "error" not in o[i]
            ]
            if "error" not in r and got:
                per.append(r["bytes"] / r["seconds"] / max(got))
        if per:
            each = ", ".join(f"{x:.2f}" for x in per)
            print(f"  {'':{len(case)}s}  per round {each}: median {statistics.median(per):.2f}x")

    print("\nratios (best rounds)")
    unc = ["st_lazy", "st_eager", "runai", "fastsafetensors", "instanttensor"]
    unc += [f"sp_{f}{r}" for f in ("hf", "none") for r in ("", "_direct", "_buffered")]
    ratio("link-fuse", "sp_default", unc)
    ratio("link-s3", "sp_default", ["s3_get_load", "s3_parallel_load", "s3_runai", "sp_none"])
    ratio("local-warm", "sp_default", ["st_lazy"])
    ratio("local-cold", "sp_default", unc)
    ratio("local-warm", "sp_none", ["st_lazy"])
    ratio("local-cold", "sp_hf", ["fastsafetensors"])
    ratio("local-cold", "sp_hf", ["runai"])
    ratio("local-cold", "sp_hf", ["sp_hf_mt"])
    ratio("local-warm", "sp_hf", ["sp_hf_mt"])
    ratio("local-cold", "sp_hf_direct", ["fastsafetensors"])
    ratio("local-cold", "sp_hf", ["sp_hf_buffered"])
    ratio("local-cold", "sp_hf_auto", ["sp_hf_buffered", "sp_hf_direct"])
    ratio("local-cold", "sp_none_auto", ["sp_none_buffered", "sp_none_direct"])
    ratio("local-cold", "sp_none", ["runai", "fastsafetensors"])
    ratio("local-cold", "sp_default", ["sp_default_buffered"])
    ratio("local-cold", "sp_default_direct", unc)
    ratio("local-cold", "sp_default_auto", ["sp_default", "sp_default_direct"])
    ratio("local-warm", "sp_hf", ["fastsafetensors"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/serving"))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--link-mbps", type=float, default=1000.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--cases", default="link-s3,link-fuse,local-cold,local-warm")
    ap.add_argument("--s3-server", default="auto", choices=["auto", "fast", "moto"])
    ap.add_argument("--child")
    ap.add_argument("--root")
    ap.add_argument("--s3")
    ap.add_argument("--throttle", nargs=3)
    args = ap.parse_args()
    if args.throttle:
        listen, target, r = args.throttle
        throttle_serve(int(listen), int(target), float(r))
        return
    if args.child:
        child(args.child, args.root, args.scale, json.loads(args.s3) if args.s3 else None)
        return
    if args.only:  # before any setup: a misspelt name is an error, not a run of nothing
        known = dict.fromkeys(FILE_LOADERS + S3_LOADERS)
        unknown = [n for n in args.only.split(",") if n not in known]
        if unknown:
            raise SystemExit(
                f"--only: unknown loader(s) {', '.join(map(repr, unknown))}; valid: "
                + ", ".join(known)
            )
    args.out = args.out.resolve()
    bench(args)


if __name__ == "__main__":
    main()
