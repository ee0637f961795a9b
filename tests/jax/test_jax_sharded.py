"""Sharded ``jax.Array`` leaves: written shard by shard, restored onto another mesh (8 -> 2 host
devices and back) reading only the boxes each device needs.

jax reads ``XLA_FLAGS`` once, at import, so the scenario runs in a subprocess with
``--xla_force_host_platform_device_count=8`` (``sharded_child.py``) and reports what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax", reason="jax is an optional dependency (shardpoint[jax])")

CHILD = os.path.join(os.path.dirname(__file__), "sharded_child.py")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sharded")
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    p = subprocess.run(
        [sys.executable, CHILD, str(root)], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_each_distinct_shard_is_one_entry(report: dict) -> None:
    # 4x2 mesh, both axes sharded: 8 boxes of 4 rows x 3 columns.
    assert len(report["w_pieces"]) == 8
    assert "w@0:4,0:3" in report["w_pieces"] and "w@12:16,3:6" in report["w_pieces"]
    # Sharded on one mesh axis, replicated on the other: each box once (replica 0 only).
    assert report["r_pieces"] == ["r@0:4,0:6", "r@12:16,0:6", "r@4:8,0:6", "r@8:12,0:6"]
    # Fully replicated: one plain entry.
    assert report["rep_keys"] == ["rep"]


def test_restore_onto_two_devices_reads_each_byte_once(report: dict) -> None:
    assert report["w_equal"] and report["r_equal"] and report["rep_equal"]
    assert report["step"] == 3
    assert report["w_sharding_ok"] and report["w_device_count"] == 2
    # Each of the 2 target devices reads only the overlapping stored boxes: in total exactly
    # the array's 96 elements, every stored piece read once (no whole-array reads per device).
    assert report["w_elements_read"] == 96
    assert set(report["reads_per_w_piece"].values()) == {1}
    assert len(report["reads_per_w_piece"]) == 8
    assert report["rep_elements_read"] == 96  # a plain entry is read by row ranges per device


def test_two_devices_back_to_eight(report: dict) -> None:
    assert report["b_pieces"] == ["w@0:16,0:3", "w@0:16,3:6"]
    assert report["back_equal"]
    assert report["back_shards"] == 8 and report["back_shard_shapes"] == [[4, 3]]
    assert report["plain_equal"]


def test_missing_shard_is_detected(report: dict) -> None:
    assert "cover 84 of the 96 elements" in report["missing_piece"]
