"""``shardpoint.storage.progress``: a tqdm bar only when wanted (TTY or forced), else a silent no-op."""

from __future__ import annotations

import io
import os
import sys
import time

import pytest

from shardpoint.storage import progress


def test_default_follows_whether_stderr_is_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress.wanted(None) is False
    assert progress.wanted(True) is True and progress.wanted(False) is False
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w") as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            assert progress.wanted(None) is True
    finally:
        os.close(master)


def test_no_bar_when_not_wanted(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    bar = progress.progress_bar(100, "x")
    bar.update(50)
    bar.set_postfix_str("y")
    bar.close()
    assert buf.getvalue() == ""
    assert progress.run_with_spinner(lambda: 7, "x") == 7


def test_forced_bar_draws_on_stderr_after_its_delay(monkeypatch):
    pytest.importorskip("tqdm")
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    bar = progress.progress_bar(4 << 20, "convert demo", progress=True)
    time.sleep(0.6)  # bars appear only for work that takes more than half a second
    bar.update(2 << 20)
    bar.close()
    assert "convert demo" in buf.getvalue() and "MB" in buf.getvalue()


def test_spinner_reports_elapsed_time_and_returns_the_result(monkeypatch):
    pytest.importorskip("tqdm")
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    assert (
        progress.run_with_spinner(lambda: time.sleep(0.8) or "done", "verify x", progress=True)
        == "done"
    )
    assert "verify x" in buf.getvalue()


def test_without_tqdm_bars_are_no_ops(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    bar = progress.progress_bar(10, "x", progress=True)
    bar.update(1)
    bar.close()
    assert progress.run_with_spinner(lambda: 1, "x", progress=True) == 1
