"""The pytest plugin (entry point ``pytest11``) and Hypothesis hook (entry point
``hypothesis``) of ``shardpoint[testing]``: Hypothesis settings profiles ``ci``, ``dev`` and
``nightly``, as zarr-python keeps them.

This is a top-level package of its own, beside ``shardpoint``, for the reason Hypothesis has
``_hypothesis_pytestplugin``: pytest loads every installed plugin in every run, and a module
inside ``shardpoint`` would import the whole package (numpy, the compiled core) first. This
one imports nothing at all until asked; Hypothesis only when a profile is loaded.

* ``ci`` — a suite's default run: 100 examples per test (Hypothesis' own number),
  derandomized so that a failure reproduces on every run, no deadline (tests write files);
* ``dev`` — quick local iterations: 20 examples, 20 steps per state machine run;
* ``nightly`` — the long run: 2000 examples, 100 steps per state machine run, random seeds.

``ci`` and ``dev`` also bound shrinking to :data:`SHRINK_SECONDS` (Hypothesis allows itself
300 s): every example of a checkpoint property writes files, and a failure found in seconds
took 25 to 110 s to shrink on two cores before it was reported. After the bound Hypothesis
reports the smallest failing example found so far. Hypothesis has no setting for this; the
bound is its engine's ``MAX_SHRINKING_SECONDS``, set when one of these profiles is loaded
through this plugin (``SHARDPOINT_HYPOTHESIS_PROFILE``, ``--hypothesis-profile`` under
pytest, or :func:`load_profile`) and put back for the others.

The profiles are registered whenever Hypothesis is imported, never over a profile of the same
name registered before. Pick one with Hypothesis' ``--hypothesis-profile=ci`` or the
environment variable ``SHARDPOINT_HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "PROFILES",
    "SHRINK_SECONDS",
    "ENV",
    "register_profiles",
    "load_profile",
    "bound_shrinking",
]

ENV = "SHARDPOINT_HYPOTHESIS_PROFILE"

PROFILES: dict[str, dict[str, Any]] = {
    "ci": {"max_examples": 100, "derandomize": True, "deadline": None, "print_blob": True},
    "dev": {"max_examples": 20, "stateful_step_count": 20, "deadline": None},
    "nightly": {"max_examples": 2000, "stateful_step_count": 100, "deadline": None},
}


#: Seconds of shrinking a failure gets under the profiles that bound it (measured: a failing
#: round-trip property reports within 20 s on two cores; docs/TESTING.md).
SHRINK_SECONDS: dict[str, int] = {"ci": 10, "dev": 10}
_UNBOUNDED: list[int] = []  # Hypothesis' own bound, kept when first replaced


def bound_shrinking(name: str | None) -> None:
    """Bound shrinking as profile ``name`` asks (Hypothesis' own bound for the others)."""
    try:
        from hypothesis.internal.conjecture import engine
    except ImportError:  # a Hypothesis laid out otherwise: its own bound stays
        return
    if not isinstance(getattr(engine, "MAX_SHRINKING_SECONDS", None), int):
        return
    if not _UNBOUNDED:
        _UNBOUNDED.append(engine.MAX_SHRINKING_SECONDS)
    engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS.get(name or "", _UNBOUNDED[0])


def register_profiles() -> None:
    """Register the profiles not registered yet (imports Hypothesis)."""
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    for name, values in PROFILES.items():
        try:
            settings.get_profile(name)
            continue  # a profile of that name registered first (the user's) wins
        except InvalidArgument:
            pass
        # checkpoint tests write files: a slow example is expected, not a health problem
        settings.register_profile(name, suppress_health_check=[HealthCheck.too_slow], **values)


def load_profile(name: str) -> None:
    """Register the profiles and make ``name`` the active one."""
    from hypothesis import settings

    register_profiles()
    settings.load_profile(name)
    bound_shrinking(name)


def _hypothesis_setup_hook() -> None:
    """Entry point ``hypothesis``: run by Hypothesis when it is imported."""
    register_profiles()


def pytest_configure(config: Any) -> None:
    """Entry point ``pytest11``: load the profile named by ``SHARDPOINT_HYPOTHESIS_PROFILE``."""
    name = os.environ.get(ENV)
    if name:
        load_profile(name)
        return
    try:  # chosen with Hypothesis' own option: its plugin loads it, we bound its shrinking
        chosen = config.getoption("hypothesis_profile")
    except ValueError:
        chosen = None
    if chosen:
        bound_shrinking(chosen)


def pytest_report_header(config: Any) -> str | None:
    name = os.environ.get(ENV)
    return f"shardpoint.testing: hypothesis profile {name!r} (from ${ENV})" if name else None
