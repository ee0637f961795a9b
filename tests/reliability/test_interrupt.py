"""Ctrl-C during a long save or load (issue 22): the call stops within half a second, the
KeyboardInterrupt propagates, an interrupted save commits nothing and leaves no temp file, and
the previous checkpoint at the same path still loads.

A real child process gets a real SIGINT while inside the core call. The save and the load are
slowed by the core's test hook ``SHARDPOINT_TEST_CHECK_PAUSE_US`` (every cancellation check, one
per chunk, sleeps 50 ms), so that a small checkpoint takes seconds even on many cores; the
latency measured therefore includes up to one pause. The stop latency (SIGINT sent ->
KeyboardInterrupt caught in the child) is printed with ``-s``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import shardpoint as sp

HELPER = os.path.join(os.path.dirname(__file__), "..", "reliability_helpers", "interrupt_child.py")
#: the target is 0.5 s; the slack covers a loaded 2-core CI machine
LATENCY_LIMIT_S = 0.5 + 0.5


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupt(mode: str, path: str, form: str, env_extra: dict[str, str]) -> float:
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), ".."), env.get("PYTHONPATH", "")]
    )
    child = subprocess.Popen(
        [sys.executable, HELPER, mode, path, form],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A test run started in the background by a non-interactive shell (`make test &`,
        # nohup) ignores SIGINT, and an ignored signal stays ignored across exec: the child
        # would never see the Ctrl-C this test sends. Give it the default disposition, so
        # that its Python installs the KeyboardInterrupt handler as in a terminal.
        preexec_fn=_default_sigint,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("ready"), (line, child.stderr.read() if child.stderr else "")
        time.sleep(0.8)  # well inside the long call
        sent = time.time()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    word, stamp = out.split()[:2]
    assert word == "interrupted", (out, err)
    return float(stamp) - sent


@pytest.mark.parametrize("form", ["prefix", "single"])
def test_ctrl_c_stops_a_save_commits_nothing(tmp_path, form):
    path = str(tmp_path / ("ckpt.pt" if form == "single" else "ckpt"))
    before = sorted(os.listdir(tmp_path))
    latency = _interrupt("save", path, form, {"SHARDPOINT_TEST_CHECK_PAUSE_US": "50000"})
    print(f"\nCtrl-C stop latency, {form} save: {latency * 1000:.0f} ms")
    assert latency < LATENCY_LIMIT_S
    after = sorted(os.listdir(tmp_path))
    assert not [f for f in after if ".tmp-" in f or f.endswith(".lock")], after
    assert before == [] and after == (["ckpt.pt"] if form == "single" else after)
    got = sp.load_file(path)  # the previous (small) checkpoint, intact
    np.testing.assert_array_equal(got["step"], [1])
    assert set(got) == {"step", "w"}


def test_ctrl_c_stops_a_load(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    big = {f"t{i}": np.arange(1 << 20, dtype=np.float32) * i for i in range(4)}
    sp.save_file(big, path, chunk_bytes=16 << 10)  # 1024 chunks, each a cancellation check
    latency = _interrupt("load", path, "single", {"SHARDPOINT_TEST_CHECK_PAUSE_US": "50000"})
    print(f"\nCtrl-C stop latency, load: {latency * 1000:.0f} ms")
    assert latency < LATENCY_LIMIT_S
    assert len(sp.load_file(path)) == 4


def test_ctrl_c_stops_a_convert_writing_nothing(tmp_path):
    """``shardpoint convert`` adds values from a thread pool; Ctrl-C in the main thread cancels
    the adds running there (they are not on the main thread, so only the writer's own
    cancellation reaches them) and the queued ones, and nothing is left at the destination."""
    st_numpy = pytest.importorskip("safetensors.numpy")
    src = str(tmp_path / "src.safetensors")
    rng = np.random.default_rng(0)
    st_numpy.save_file(
        {f"t{i}": rng.standard_normal(2 << 20, dtype=np.float32) for i in range(12)}, src
    )
    # 100 ms per check keeps the convert running for seconds (about 180 checks), and the stop
    # adds little of the hook's own sleeping: with 200 ms the abort alone took about 0.5 s
    # (the running add's checks), and the latency measured 0.6-0.8 s of the 1 s limit on a
    # loaded 2-core machine; with 100 ms the abort takes under 0.1 s there.
    latency = _interrupt("convert", src, "prefix", {"SHARDPOINT_TEST_CHECK_PAUSE_US": "100000"})
    print(f"\nCtrl-C stop latency, convert: {latency * 1000:.0f} ms")
    assert latency < LATENCY_LIMIT_S
    assert sorted(os.listdir(tmp_path)) == ["src.safetensors"]
