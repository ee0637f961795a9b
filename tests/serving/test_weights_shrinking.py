"""A file shortened by another tool while ``weights_iterator`` reads it ahead of its consumer.

The iterator's read-ahead thread used to copy uncompressed values out of a mapping of the file
(``io="mmap"``, and ``"auto"`` on a local disk). A size check before each copy cannot close
the race with a truncation that lands during the copy: the touched page past the new end of
file killed the process with SIGBUS (CI saw it once in ``test_hf_hostile``). Values are now
read with ``pread``, which returns short instead. Here the truncation is timed to land while
the read-ahead is busy, in many trials per process, in a fresh process (a SIGBUS fails the
test instead of killing pytest): every value handed out is exact, the rest are refused with a
``CorruptCheckpointError`` naming the file, and the process lives."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

_RACE = r"""
import os, sys, numpy as np, torch, shardpoint as sp, shardpoint.torch as spt
from safetensors.numpy import save_file
kind, where, trials = sys.argv[1], sys.argv[2], int(sys.argv[3])
n, count = 128 << 10, 48  # 48 values of 512 KiB: the read-ahead has work left at each cut
state = {f"w{i:02d}": np.arange(n, dtype=np.float32) + i for i in range(count)}
refused = 0
for trial in range(trials):
    path = os.path.join(where, f"t{trial}")
    if kind == "hf":
        path += ".safetensors"
        save_file(state, path)
        files = [path]
    else:
        sp.save_file(state, path, compression=None, shards=2)
        with sp.open(path) as r:
            files = [f for f, _ in r.format_info["shards"]]
    cut_after = 1 + trial % 7  # the consumer cuts the files after this many values
    got = 0
    try:
        with spt.weights_iterator(path, io="mmap", window=8 << 20) as it:
            for name, t in it:
                want = torch.from_numpy(state[name])
                if not torch.equal(t, want):
                    sys.exit(f"trial {trial}: {name} handed out with wrong values")
                got += 1
                if got == cut_after:
                    for f in files:
                        os.truncate(f, os.path.getsize(f) // 3)
    except sp.CorruptCheckpointError as e:
        if not any(f in str(e) for f in files) or "truncated" not in str(e):
            sys.exit(f"trial {trial}: the error names neither file nor cause: {e}")
        refused += 1
    for f in files:
        os.remove(f)
print(f"refused {refused} of {trials}")
"""


@pytest.mark.parametrize("kind", ["hf", "shardpoint"])
def test_a_file_cut_while_read_ahead_is_refused_not_a_sigbus(
    tmp_path: pathlib.Path, kind: str
) -> None:
    trials = 24
    got = subprocess.run(
        [sys.executable, "-c", _RACE, kind, str(tmp_path), str(trials)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # -7: SIGBUS, the failure this guards against
    assert got.returncode == 0, (got.returncode, got.stdout[-1000:], got.stderr[-2000:])
    refused = int(got.stdout.split()[1])
    # each cut removes two thirds of the file while most values are still to come: a trial
    # whose iterator ran to the end without a refusal handed out values it could not have read
    assert refused == trials, got.stdout
