"""Converting a safetensors file that shrinks while it is read (a foreign tool, a partial copy
finishing over it): the source reads through safetensors' mapping, where a page past the new
end of file killed the process with SIGBUS (float32), or read too few bytes and failed with
numpy's reshape error (float8, read raw). Each read now checks the file's size first and raises
a CorruptCheckpointError naming the file and key. In a fresh process, so that a SIGBUS fails
the test instead of killing pytest."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

_SHRINK = r"""
import os, sys, shardpoint as sp
from shardpoint.convert.safetensors_io import SafetensorsSource
path = sys.argv[1]
with SafetensorsSource(path) as src:
    src.read("t0")
    os.truncate(path, os.path.getsize(path) // 2)
    try:
        for k in ("t1", "t2", "t3"):
            src.read(k).sum()
    except sp.CorruptCheckpointError as e:
        print("refused:", e)
"""


@pytest.mark.parametrize("dtype", ["float32", "float8_e4m3fn"])
def test_a_source_file_that_shrinks_while_converted(tmp_path, dtype: str) -> None:
    p = tmp_path / "model.safetensors"
    if dtype == "float32":
        from safetensors.numpy import save_file

        save_file({f"t{i}": np.arange(300_000, dtype=np.float32) for i in range(4)}, str(p))
    else:
        torch = pytest.importorskip("torch")
        from safetensors.torch import save_file as save_torch

        save_torch(
            {f"t{i}": torch.zeros(300_000, dtype=torch.float8_e4m3fn) for i in range(4)}, str(p)
        )
    size = p.stat().st_size
    got = subprocess.run(
        [sys.executable, "-c", _SHRINK, str(p)], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    want = rf"refused: {re.escape(str(p))}: key 't1': file is now {size // 2} bytes, {size} when"
    assert re.search(want, got.stdout), got
