"""The serving packages import without their engines (and without torch or transformers), and
name the extra to install when a class that needs one is used."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("vllm", "sglang", "torch", "transformers", "accelerate"):
            raise ImportError(f"No module named {name!r} (blocked)")
        return None

sys.meta_path.insert(0, Block())
import shardpoint.vllm as v, shardpoint.sglang as s, shardpoint.hf as h
assert v.LOAD_FORMAT == "shardpoint" and v.SHARDED_LOAD_FORMAT == "shardpoint_sharded"
for what in (lambda: v.ShardpointModelLoader, v.register, lambda: s.ShardpointModelLoader):
    try:
        what()
    except ImportError as e:
        print(e)
"""


def test_serving_packages_import_without_engines() -> None:
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3
    assert "shardpoint[vllm]" in lines[0] and "shardpoint[vllm]" in lines[1]
    assert "shardpoint[sglang]" in lines[2]
