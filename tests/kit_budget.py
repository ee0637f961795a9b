"""How many examples and state machine steps a test of tests/testing may spend, scaled by the
active Hypothesis profile (ci: 100 examples per test, nightly: 2000; see _shardpoint_plugin)."""

from __future__ import annotations

from hypothesis import settings


def scaled(fraction: float, *, at_least: int = 1) -> int:
    """``fraction`` of the active profile's ``max_examples`` (100 in ci, 2000 in nightly)."""
    return max(at_least, int(settings.default.max_examples * fraction))


def steps(at_most: int) -> int:
    """State machine steps: the profile's count, at most ``at_most`` unless the profile asks
    for more than Hypothesis' default of 50 (nightly)."""
    n = settings.default.stateful_step_count
    return n if n > 50 else min(n, at_most)
