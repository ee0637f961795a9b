"""Child process of tests/reliability/test_interrupt.py: commits a small checkpoint at PATH
then starts a long save of PATH (or loads the checkpoint the test wrote at PATH), and reports
when Ctrl-C's KeyboardInterrupt arrived.

    python interrupt_child.py save|load|convert PATH single|prefix

Prints ``ready <time>`` just before the long call, then ``interrupted <time>`` (the time the
KeyboardInterrupt reached Python) or ``finished <time>``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import shardpoint as sp


def main() -> None:
    mode, path, form = sys.argv[1], sys.argv[2], sys.argv[3]
    single = form == "single"
    small = {"step": np.array([1], dtype=np.int64), "w": np.zeros(16, np.float32)}
    if mode == "save":
        sp.save_file(small, path, single_file=single)
        # 768 chunks of 16 KiB; the test's pause hook makes each chunk's cancellation check
        # sleep, so the save lasts seconds even on many cores.
        rng = np.random.default_rng(0)
        big = {f"t{i}": rng.integers(0, 64, size=4 << 20, dtype=np.uint8) for i in range(3)}
        call = lambda: sp.save_file(big, path, single_file=single, chunk_bytes=16 << 10)  # noqa: E731
    elif mode == "convert":
        # PATH is a safetensors file the test wrote; the CLI reports Ctrl-C as exit 130
        from shardpoint.cli import main as cli

        def call() -> None:
            if cli(["convert", path, path + ".out", "--no-progress"]) == 130:
                raise KeyboardInterrupt
    else:
        # (the test wrote PATH; the load is slowed by the test's pause hook)
        call = lambda: sp.load_file(path)  # noqa: E731
    print("ready", time.time(), flush=True)
    try:
        call()
    except KeyboardInterrupt:
        print("interrupted", time.time(), flush=True)
        return
    print("finished", time.time(), flush=True)


if __name__ == "__main__":
    main()
