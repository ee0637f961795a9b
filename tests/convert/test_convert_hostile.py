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


_RACE = r"""
import os, sys, time, numpy as np, shardpoint as sp
from safetensors.numpy import save_file
from shardpoint.convert.safetensors_io import SafetensorsSource
where, trials = sys.argv[1], int(sys.argv[2])
state = {f"w{i:02d}": np.arange(1 << 20, dtype=np.float32) + i for i in range(32)}
refused = 0
for trial in range(trials):
    path = os.path.join(where, f"t{trial}.safetensors")
    save_file(state, path)
    with SafetensorsSource(path) as src:
        src.read("w00")  # warm: the loop below is copies, and the cut lands inside one
        # another process cuts the file (a thread could not: the read holds the GIL throughout)
        size, pid = os.path.getsize(path), os.fork()
        if pid == 0:
            time.sleep(0.001 * (trial % 12))
            os.truncate(path, size // 3)
            os._exit(0)
        try:  # round and round until the cut is seen, however late the other process runs
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for key in sorted(state):
                    if not np.array_equal(src.read(key), state[key]):
                        sys.exit(f"trial {trial}: {key} read with wrong values")
            sys.exit(f"trial {trial}: the file cut by another process was never refused")
        except sp.CorruptCheckpointError as e:
            if path not in str(e) or "truncated" not in str(e):
                sys.exit(f"trial {trial}: the error names neither file nor cause: {e}")
            refused += 1
        os.waitpid(pid, 0)
    os.remove(path)
print(f"refused {refused} of {trials}")
"""


def test_a_source_cut_during_a_read_is_refused_not_a_sigbus(tmp_path) -> None:
    """The size check before each read cannot close the race with a cut (by another process)
    that lands during the read itself: through safe_open's mapping that was a SIGBUS; values
    are now read with pread, which returns short."""
    trials = 48
    got = subprocess.run(
        [sys.executable, "-c", _RACE, str(tmp_path), str(trials)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, (got.returncode, got.stdout[-1000:], got.stderr[-2000:])
    assert got.stdout.split()[1] == str(trials), got.stdout
