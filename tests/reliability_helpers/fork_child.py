"""The parent process of the fork tests (tests/reliability/test_fork.py), run in a fresh
interpreter so that nothing but this script has run shardpoint in it.

    python -m reliability_helpers.fork_child SCENARIO DIRECTORY BUCKET

First it does what a training script does before it forks: saves, loads, verifies, reads
remotely (``s3://BUCKET`` on the moto server named by the ``AWS_*`` environment) and, for the
DataLoader scenario, loads with ``shardpoint.torch.load``. Every thread pool of shardpoint then
exists. Then it forks, in the way SCENARIO names:

- ``fork``: a bare ``os.fork()`` whose child reads (a reader opened by the parent, a fresh
  one, ``load_file``, ``verify``, remote reads) and writes (local and remote saves);
- ``pool``: a ``multiprocessing`` fork pool whose workers read and write the same way;
- ``dataloader``: a torch ``DataLoader(num_workers=2, multiprocessing_context="fork")`` whose
  dataset reads shardpoint files (the issue's everyday form).

A child that hangs is detected here, with a deadline (``CHILD_SECONDS``), and reported as
``HUNG``; the test's own timeout on this process is the backstop. Prints ``OK <ms>`` (the
slowest child's time) when every child did all of its work and the values read back.
"""

from __future__ import annotations

import os
import sys
import time
import zlib

import numpy as np

import shardpoint as sp

CHILD_SECONDS = 40.0


def values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "z": rng.standard_normal(300_000).astype(np.float32),  # compressed: decoded on the pool
        "w": np.arange(2_000_000, dtype=np.int32).reshape(1000, 2000),
        "b": rng.standard_normal(1000).astype(np.float16),
    }


def fingerprint(vals: dict[str, np.ndarray]) -> int:
    return zlib.crc32(b"".join(np.ascontiguousarray(vals[k]).tobytes() for k in sorted(vals)))


def work(args: tuple[str, str, str, int]) -> tuple[int, float]:
    """A child's reads and writes; returns (fingerprint of what it read, seconds taken)."""
    directory, bucket, tag, seed = args
    t = time.perf_counter()
    local, remote = os.path.join(directory, "parent"), f"s3://{bucket}/parent"
    got = {}
    with sp.open(local) as r:
        got["z"] = np.array(r["z"])
        r.verify()
    loaded = sp.load_file(local)
    assert fingerprint(loaded) == fingerprint(values(0)), "local load differs"
    assert fingerprint(sp.load_file(remote)) == fingerprint(values(0)), "remote load differs"
    with sp.open(remote) as r:
        np.testing.assert_array_equal(r["b"], values(0)["b"])
        r.verify()
    mine = values(seed)
    for where in (os.path.join(directory, f"child-{tag}"), f"s3://{bucket}/child-{tag}"):
        sp.save_file(mine, where)
        assert fingerprint(sp.load_file(where)) == fingerprint(mine), f"{where} differs"
    got.update(loaded)
    return fingerprint(got), time.perf_counter() - t


def parent_setup(directory: str, bucket: str, torch_too: bool) -> None:
    local, remote = os.path.join(directory, "parent"), f"s3://{bucket}/parent"
    vals = values(0)
    sp.save_file(vals, local)
    sp.save_file(vals, remote)
    assert fingerprint(sp.load_file(local)) == fingerprint(vals)
    assert fingerprint(sp.load_file(remote)) == fingerprint(vals)
    with sp.open(local) as r:
        r.verify()
    with sp.open(remote) as r:
        r.verify()
    if torch_too:
        import torch

        import shardpoint.torch as sptorch

        model = torch.nn.Linear(64, 32)
        sptorch.save(model.state_dict(), os.path.join(directory, "model"))
        model.load_state_dict(sptorch.load(os.path.join(directory, "model")))


def run_fork(directory: str, bucket: str) -> float:
    # a reader opened before the fork, used by the child: the child must not reach the
    # parent's pools or connections through it either
    local_r = sp.open(os.path.join(directory, "parent"))
    remote_r = sp.open(f"s3://{bucket}/parent")
    want = fingerprint(values(0))
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            np.testing.assert_array_equal(local_r["z"], values(0)["z"])
            np.testing.assert_array_equal(remote_r["z"], values(0)["z"])
            fp, secs = work((directory, bucket, "fork", 1))
            code = 0 if fp == want else 3
            print(f"CHILD {secs * 1000:.0f}", flush=True)
        except BaseException as e:  # reported, then the child leaves without cleanup
            print(f"CHILD FAILED {e!r}", flush=True)
        os._exit(code)
    deadline = time.monotonic() + CHILD_SECONDS
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"child failed with status {status}")
            secs = time.monotonic() - t
            check_written(directory, bucket, ["fork"])
            return secs
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("HUNG", flush=True)
    raise SystemExit(2)


def check_written(directory: str, bucket: str, tags: list[str]) -> None:
    """The parent reads what the children wrote."""
    for i, tag in enumerate(tags):
        seed = i + 1
        for where in (os.path.join(directory, f"child-{tag}"), f"s3://{bucket}/child-{tag}"):
            assert fingerprint(sp.load_file(where)) == fingerprint(values(seed)), where


def run_pool(directory: str, bucket: str) -> float:
    import multiprocessing as mp

    want = fingerprint(values(0))
    tags = ["p0", "p1", "p2", "p3"]
    with mp.get_context("fork").Pool(2) as pool:
        try:
            res = pool.map_async(
                work, [(directory, bucket, t, i + 1) for i, t in enumerate(tags)]
            ).get(timeout=CHILD_SECONDS)
        except mp.TimeoutError:
            pool.terminate()
            print("HUNG", flush=True)
            raise SystemExit(2) from None
    assert all(fp == want for fp, _ in res), "a worker read different values"
    check_written(directory, bucket, tags)
    return max(s for _, s in res)


def run_dataloader(directory: str, bucket: str) -> float:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Shards(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> torch.Tensor:
            where = os.path.join(directory, "parent") if i % 2 else f"s3://{bucket}/parent"
            with sp.open(where) as r:
                return torch.from_numpy(np.array(r["z"][i * 10 : i * 10 + 10]))

    t = time.perf_counter()
    loader = DataLoader(
        Shards(),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=CHILD_SECONDS,
    )
    try:
        got = list(loader)
    except RuntimeError as e:
        if "timed out" in str(e):
            print("HUNG", flush=True)
            raise SystemExit(2) from None
        raise
    z = values(0)["z"]
    for i, x in enumerate(got):
        np.testing.assert_array_equal(x.numpy(), z[i * 10 : i * 10 + 10])
    return time.perf_counter() - t


def main() -> None:
    scenario, directory, bucket = sys.argv[1:4]
    parent_setup(directory, bucket, torch_too=scenario == "dataloader")
    run = {"fork": run_fork, "pool": run_pool, "dataloader": run_dataloader}[scenario]
    secs = run(directory, bucket)
    print(f"OK {secs * 1000:.0f}", flush=True)


if __name__ == "__main__":
    main()
