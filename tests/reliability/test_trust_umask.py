"""Issue 12 item 12: every file shardpoint creates gets mode 0666 minus the umask.

A child process sets the umask, then saves with the file API, a ``CheckpointManager`` (state
file) and ``shardpoint convert`` to ``.safetensors``. Every file left in the directory must have
exactly ``0o666 & ~umask``; before, the state file and converted outputs were 0600 (mkstemp), so
another user who could load the checkpoints got PermissionError from ``latest_checkpoint``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import shardpoint as sp
    from shardpoint.cli import main
    d, mask = sys.argv[1], int(sys.argv[2], 8)
    os.umask(mask)
    sp.save_file({"w": np.arange(3000, dtype=np.float32), "n": 3}, os.path.join(d, "plain"))
    ck = sp.Checkpoint(w=sp.Variable(np.zeros(4, np.float32)))
    mgr = sp.CheckpointManager(ck, os.path.join(d, "run"), max_to_keep=2)
    for _ in range(3):
        mgr.save()
    assert main(["convert", os.path.join(d, "plain"), os.path.join(d, "out.safetensors")]) == 0
    """
)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o027])
def test_created_files_respect_the_umask(tmp_path, mask):
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), oct(mask)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    modes = {}
    for root, _, names in os.walk(tmp_path):
        for n in names:
            p = os.path.join(root, n)
            modes[os.path.relpath(p, tmp_path)] = stat.S_IMODE(os.stat(p).st_mode)
    want = 0o666 & ~mask
    assert "run/checkpoint" in modes and "out.safetensors" in modes and "plain.index" in modes
    wrong = {p: oct(m) for p, m in modes.items() if m != want}
    assert not wrong, (oct(want), wrong)
