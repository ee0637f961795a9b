"""Issue 23 item 2: reading a hostile TensorBundle index stays within the documented memory
bound, at sizes just under the key budget (docs/RELIABILITY.md):

- every key built while parsing is charged to a budget of ``64 MiB + 32 n`` bytes (``n``: the
  index size): each key as it is expanded, and again the in-memory size of each key kept
  (convertible and skipped entries: the Keras/TF import reads string tensors from there);
- notes list the first 64 skipped entries (keys cut to 100 characters) and count the rest;
- so the peak RSS growth of parsing is at most ``64 MiB + 64 n``, and of ``shardpoint ls`` /
  ``convert`` at most three times that (``convert`` holds the kept keys up to four times: the
  source's, the writer's, the index's key blob and the index file being written).

Each case runs in a child process that reports its peak RSS growth (``VmHWM`` reset after the
imports, through ``/proc/self/clear_refs``). The cases are sized from
the same charges the parser makes, so each is just under the budget (it parses), and the same
case one notch larger is refused ("keys expand").
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from reliability_helpers import tf_index as tf

MIB = 1 << 20
_KEY_BASE, _PER_BYTE = 64 * MIB, 32


def _budget(n: int) -> int:
    return _KEY_BASE + _PER_BYTE * n


_CHILD = textwrap.dedent(
    """
    import contextlib, os, sys
    import shardpoint as sp
    from shardpoint.cli import main
    from shardpoint.convert.tensorbundle import TensorBundleReader

    def kib(field):
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith(field + ":"))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) restarts from the RSS now, after the imports
    before = kib("VmRSS")
    what, prefix = sys.argv[1], sys.argv[2]
    if what == "parse":
        try:
            r = TensorBundleReader(prefix)
            out = (f"parsed entries={len(r.entries)} skipped={r.skipped_count} "
                   f"notes={len(r.notes)} longest_note={max(map(len, r.notes), default=0)}")
        except sp.CorruptCheckpointError as e:
            out = "refused " + str(e)[-120:]
    else:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \\
                contextlib.redirect_stderr(null):
            out = f"exit={main([what, prefix, *sys.argv[3:]])}"
    print((kib("VmHWM") - before) * 1024, out)
    """
)


def _run(*args: str) -> tuple[int, str]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    grown, text = out.stdout.strip().split(" ", 1)
    return int(grown), text


def _str_size(nchars: int, wide: bool) -> int:
    """sys.getsizeof of a str of ``nchars`` characters (4-byte kind when ``wide``)."""
    return sys.getsizeof(("\U0001f600" if wide else "k") * nchars)


def _long(kept: bool, wide: bool, notch: int = 0) -> bytes:
    """Keys of 65535 bytes (the longest accepted), as many as fit under the budget (plus
    ``notch`` more). ``wide``: each key holds one 4-byte character, so Python keeps it at
    4 bytes per character (the charge counts that)."""
    base = ("\U0001f600".encode() + b"k" * 65529) if wide else b"k" * 65533
    per_kept = _str_size(65535 - 3 * wide, wide)
    value = tf.EMPTY_F32 if kept else tf.STRING
    n1 = len(tf.long_keys(1, base, value))
    step = len(tf.long_keys(2, base, value)) - n1  # index bytes per further key

    def charges(count: int) -> int:  # what the parser spends: each key built, each key kept
        return count * 65535 + count * per_kept

    count = 1
    while charges(count + 1) <= _budget(n1 + step * count):
        count += 1
    return tf.long_keys(count + notch, base, value)


CASES = {
    # the case: string tensors under 64 KiB keys, each note once held repr() of its key
    "skipped_long_keys": lambda: _long(kept=False, wide=False),
    "kept_long_keys": lambda: _long(kept=True, wide=False),
    "kept_wide_keys": lambda: _long(kept=True, wide=True),
    "skipped_tiny_entries": lambda: tf.tiny_keys(20_000, tf.STRING),
    "skipped_empty_entries": lambda: tf.tiny_keys(30_000, b""),  # 7 index bytes each
    "kept_tiny_entries": lambda: tf.tiny_keys(20_000, tf.EMPTY_F32),
}


#: cases also listed and converted by the CLI (the issue's case, and the most kept keys)
_CLI_CASES = ("skipped_long_keys", "kept_long_keys")


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_tensorbundle_stays_within_the_bound(tmp_path, name):
    prefix = str(tmp_path / "tf")
    blob = CASES[name]()
    with open(prefix + ".index", "wb") as f:
        f.write(blob)
    open(prefix + ".data-00000-of-00001", "wb").close()  # empty tensors need no bytes
    n = len(blob)
    grown, text = _run("parse", prefix)
    print(f"{name}: index {n} B, budget {_budget(n)} B, parse +{grown} B: {text}")
    assert text.startswith("parsed"), text
    assert grown <= _KEY_BASE + 64 * n, (name, n, grown)
    fields = dict(kv.split("=") for kv in text.split()[1:])
    assert int(fields["notes"]) <= 65 and int(fields["longest_note"]) <= 1200, text
    if name not in _CLI_CASES:  # each child costs seconds on a loaded machine
        return
    for cmd in (["ls"], ["convert", str(tmp_path / "out")]):
        grown_cli, out = _run(cmd[0], prefix, *cmd[1:])
        print(f"{name}: {cmd[0]} +{grown_cli} B: {out}")
        assert out == "exit=0", (cmd, out)
        assert grown_cli <= 3 * (_KEY_BASE + 64 * n), (name, cmd, n, grown_cli)


def test_one_notch_over_the_budget_is_refused(tmp_path):
    """The wide-key case two keys larger: the same charges, now over the budget."""
    prefix = str(tmp_path / "tf")
    with open(prefix + ".index", "wb") as f:
        f.write(_long(kept=True, wide=True, notch=2))
    grown, text = _run("parse", prefix)
    assert text.startswith("refused") and "keys expand" in text, text
    assert grown <= _KEY_BASE + 64 * os.path.getsize(prefix + ".index")
