"""Each trainer integration imports without its framework, and names its extra when one of
its classes is used without it (checked in a child whose imports of the frameworks fail)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import importlib.abc, sys

BLOCKED = ("lightning", "pytorch_lightning", "lightning_fabric", "transformers", "accelerate",
           "deepspeed")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, Block())
from shardpoint.integrations import accelerate, deepspeed, hf_trainer, lightning

assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), sorted(sys.modules)
for module, name, extra in (
    (lightning, "ShardpointCheckpointIO", "shardpoint[lightning]"),
    (hf_trainer, "ShardpointTrainer", "shardpoint[transformers]"),
    (accelerate, "ShardpointAccelerator", "shardpoint[accelerate]"),
    (deepspeed, "ShardpointCheckpointEngine", "shardpoint[deepspeed]"),
):
    try:
        getattr(module, name)
    except ImportError as e:
        assert extra in str(e), (name, str(e))
    else:
        raise AssertionError(f"{name} resolved without its framework")
print("OK")
"""


def test_integrations_import_without_their_frameworks() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-3000:]
