"""Checks of the source distribution, run by `make test-wheel` (not collected by pytest).

usage: sdist_checks.py SDIST PYTHON TARGET_DIR CARGO_DIR

PATH holds no cargo when this starts. PYTHON is a fresh virtual environment's interpreter with
maturin and numpy installed (builds run without build isolation, so nothing is downloaded).
1. The sdist carries what a build needs: pyproject.toml, the build backend wrapper, both crates.
2. Without cargo on PATH, building stops within a minute with our message, and no toolchain is
   fetched (maturin's fallback would print "Rust not found, installing into a temporary directory").
3. With cargo on PATH, the sdist builds a wheel from source that installs and round-trips data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def build(sdist: Path, python: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out)]
    return subprocess.run([*cmd, str(sdist)], env=env, capture_output=True, text=True, timeout=1800)


def main() -> None:
    sdist, python, target, cargo_dir = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    root = names[0].split("/")[0]
    for need in (
        "pyproject.toml",
        "build-support/shardpoint_build.py",
        "Cargo.toml",
        "rust/py/Cargo.toml",
        "rust/src/lib.rs",
        "python/shardpoint/__init__.py",
    ):
        assert f"{root}/{need}" in names, f"{sdist.name} lacks {need}"
    print(f"[sdist] {sdist.name}: {len(names)} files, {sdist.stat().st_size // 1024} KiB")

    env = dict(os.environ)
    assert "cargo" not in {
        p.name for d in env["PATH"].split(":") if os.path.isdir(d) for p in Path(d).iterdir()
    }, env["PATH"]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        r = build(sdist, python, Path(d), env)
        dt = time.perf_counter() - t0
        text = r.stdout + r.stderr
        assert r.returncode != 0, "the sdist built without cargo?"
        assert "needs a Rust toolchain" in text, text[-3000:]
        assert "installing into a temporary directory" not in text, text[-3000:]
        assert dt < 60, f"the no-cargo failure took {dt:.0f} s"
        print(f"[sdist] without cargo: refused in {dt:.1f} s with the toolchain message")

    env["PATH"] = f"{cargo_dir}:{env['PATH']}"
    env["CARGO_TARGET_DIR"] = target
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        r = build(sdist, python, Path(d), env)
        assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
        wheels = list(Path(d).glob("shardpoint-*.whl"))
        assert len(wheels) == 1, wheels
        print(f"[sdist] built {wheels[0].name} from source in {time.perf_counter() - t0:.0f} s")
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--no-deps", str(wheels[0])], check=True, env=env
        )
    code = (
        "import numpy as np, shardpoint as sp, tempfile, os\n"
        "d = tempfile.mkdtemp(); p = os.path.join(d, 'c')\n"
        "sp.save_file({'a': np.arange(10.0)}, p)\n"
        "assert (sp.load_file(p)['a'] == np.arange(10.0)).all()\n"
        "assert 'site-packages' in sp.__file__, sp.__file__\n"
    )
    subprocess.run([python, "-c", code], check=True, env=env, cwd=tempfile.gettempdir())
    print("[sdist] the wheel built from the sdist imports and round-trips data")


if __name__ == "__main__":
    main()
