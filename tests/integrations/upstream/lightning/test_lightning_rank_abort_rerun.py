"""The one failure Lightning's ported tests are run again for is what a real aborted rank
raises, and a rank that fails any other way is not (conftest.py, ``_RANK_ABORTED``)."""

from __future__ import annotations

import os
import re
import sys

import pytest

torch_mp = pytest.importorskip("torch.multiprocessing")


def _abort(rank: int) -> None:
    os.abort()


def _exit_with_code(rank: int) -> None:
    sys.exit(3)


def _failure_of(target) -> str:
    context = torch_mp.start_processes(target, nprocs=1, join=False, start_method="spawn")
    with pytest.raises(torch_mp.ProcessExitedException) as caught:
        while not context.join():
            pass
    return f"{type(caught.value).__name__}: {caught.value}"


def test_a_rank_killed_by_sigabrt_is_run_again(rank_aborted_pattern: str) -> None:
    failure = _failure_of(_abort)
    assert re.search(rank_aborted_pattern, failure), failure


def test_a_rank_exiting_with_a_code_is_not(rank_aborted_pattern: str) -> None:
    failure = _failure_of(_exit_with_code)
    assert "exit code 3" in failure
    assert re.search(rank_aborted_pattern, failure) is None
