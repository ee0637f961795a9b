"""Two jax processes (``jax.distributed`` on CPU, gloo collectives) save one sharded array: each
writes only its addressable shards through its own multi-rank Writer, process 0 merges, and
both restore it onto another sharding."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="jax is an optional dependency (shardpoint[jax])")

CHILD = os.path.join(os.path.dirname(__file__), "multiprocess_child.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_write_their_own_shards(tmp_path) -> None:
    port = str(_free_port())
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, CHILD, str(i), str(tmp_path), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rep in outs:
        assert rep["n_local"] == 4
        assert rep["ok"] and rep["step"] == 5
        assert len([k for k in rep["keys"] if k.startswith("w@")]) == 8
        # One shard file per process: each wrote its own addressable shards.
        assert rep["shards"] == ["ck.data-00000-of-00002", "ck.data-00001-of-00002"]
