"""Issue 12 item 4: shard files truncated while a reader has the checkpoint open.

Each case runs in its own child process: the child opens a checkpoint, truncates a shard (as a
foreign tool, a partial rsync or a full network disk would), then reads. The library must
raise ``CorruptCheckpointError`` naming the file (never die by SIGBUS/SIGSEGV, never hand out a
view past the end of a mapping); the parent asserts the child exited normally and printed the
expected outcome. Arrays loaded with ``copy=True`` stay usable after the truncation.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp

_PRELUDE = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import shardpoint as sp
    p = sys.argv[1]
    def cut(r):
        [(path, n)] = r.format_info["shards"]
        os.truncate(path, 4096)  # keeps the header, cuts every payload
        return path
    def expect_corrupt(f, path):
        try:
            f()
        except sp.CorruptCheckpointError as e:
            assert os.path.basename(path) in str(e), str(e)
            print("RAISED", type(e).__name__)
        else:
            print("NO ERROR")
    """
)

_CASES = {
    # a zero-copy view made after the truncation: the mapping must not run past the file
    "raw-getitem": "r = sp.open(p); s = cut(r); expect_corrupt(lambda: r['raw'].sum(), s)",
    "raw-get-noverify": "r = sp.open(p); s = cut(r); expect_corrupt(lambda: r.get('raw', verify=False).sum(), s)",
    # the mapping exists already (made by an earlier read): each new view re-checks the size
    "raw-after-mapping": "r = sp.open(p); r['raw2'].sum(); s = cut(r); expect_corrupt(lambda: r['raw'].sum(), s)",
    "compressed-getitem": "r = sp.open(p); s = cut(r); expect_corrupt(lambda: r['z'].sum(), s)",
    "verify": "r = sp.open(p); s = cut(r); expect_corrupt(r.verify, s)",
    "load": "r = sp.open(p); s = cut(r); expect_corrupt(r.load, s)",
    "load-copy": "r = sp.open(p, copy=True); s = cut(r); expect_corrupt(r.load, s)",
    "load-noverify": "r = sp.open(p, verify=False); s = cut(r); expect_corrupt(r.load, s)",
    "slice-raw": "r = sp.open(p); s = cut(r); expect_corrupt(lambda: r.slice('raw', 10, 20), s)",
    "slice-raw-noverify": "r = sp.open(p, verify=False); s = cut(r); expect_corrupt(lambda: r.slice('raw', 100000, 100010), s)",
    "slice-compressed": "r = sp.open(p); s = cut(r); expect_corrupt(lambda: r.slice('z', 200000, 200010), s)",
    # arrays read with copy=True own their memory: truncating the file cannot touch them
    "copy-survives": (
        "vals = sp.load_file(p, copy=True)\n"
        "with sp.open(p) as r: cut(r)\n"
        "assert int(vals['raw'][-1]) >= 0 and float(vals['z'][-1]) == 299999.0\n"
        "print('RAISED none', int(vals['raw'].sum()))"
    ),
}


@pytest.fixture
def ckpt(tmp_path) -> str:
    p = str(tmp_path / "ck")
    rng = np.random.default_rng(0)
    sp.save_file(
        {
            "raw": rng.integers(0, 2**32, 300_000, dtype=np.uint32),  # incompressible: stored raw
            "raw2": rng.integers(0, 2**32, 1000, dtype=np.uint32),
            "z": np.arange(300_000, dtype=np.float32),  # compresses: chunked zstd
        },
        p,
    )
    with sp.open(p) as r:
        assert r.info("raw").codec == "none" and r.info("z").codec != "none"
    return p


@pytest.mark.parametrize("case", sorted(_CASES))
def test_truncated_under_open_reader_raises_and_never_signals(ckpt, case):
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + _CASES[case], ckpt], capture_output=True, text=True
    )
    # a negative return code is death by a signal (SIGBUS/SIGSEGV): the bug this guards
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.startswith("RAISED"), out.stdout + out.stderr[-2000:]
    if case != "copy-survives":
        assert "CorruptCheckpointError" in out.stdout
