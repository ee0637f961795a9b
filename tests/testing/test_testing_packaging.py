"""Packaging of the kit: the `testing` extra, the pytest plugin beside the package (imports
nothing until asked), the Hypothesis profiles ci/dev/nightly it registers, and the profile
chosen by SHARDPOINT_HYPOTHESIS_PROFILE in a real pytest run."""

from __future__ import annotations

import importlib.metadata as md
import os
import pathlib
import subprocess
import sys
import textwrap
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_extra_and_entry_points_are_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    testing = project["optional-dependencies"]["testing"]
    assert any(r.startswith("hypothesis") for r in testing) and any(
        r.startswith("pytest") for r in testing
    )
    assert project["entry-points"]["pytest11"] == {"shardpoint": "_shardpoint_plugin"}
    installed = {
        (e.group, e.value) for g in ("pytest11", "hypothesis") for e in md.entry_points(group=g)
    }
    assert ("pytest11", "_shardpoint_plugin") in installed
    assert ("hypothesis", "_shardpoint_plugin:_hypothesis_setup_hook") in installed


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def test_plugin_imports_nothing_heavy_and_registers_profiles() -> None:
    r = _run(
        """
        import sys
        import _shardpoint_plugin as plugin
        heavy = [m for m in ("numpy", "shardpoint", "hypothesis", "torch") if m in sys.modules]
        assert not heavy, heavy
        from hypothesis import HealthCheck, settings  # the entry point registers the profiles
        ci, nightly = settings.get_profile("ci"), settings.get_profile("nightly")
        assert ci.derandomize and ci.max_examples == 100 and ci.deadline is None
        assert nightly.max_examples == 2000 and nightly.stateful_step_count == 100
        assert HealthCheck.too_slow in ci.suppress_health_check
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_profile_registered_first_wins() -> None:
    r = _run(
        """
        from hypothesis import settings
        settings.register_profile("ci", max_examples=7)
        import _shardpoint_plugin
        _shardpoint_plugin.register_profiles()
        assert settings.get_profile("ci").max_examples == 7
        print("ok")
        """,
        HYPOTHESIS_NO_PLUGINS="1",  # so the hook did not run at import, before the user's
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_environment_variable_picks_the_profile_in_pytest(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_profile.py").write_text(
        "from hypothesis import settings\n\n"
        "def test_dev_profile_is_active():\n"
        "    assert settings.default.max_examples == 20\n"
        "    assert settings.default.stateful_step_count == 20\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "SHARDPOINT_HYPOTHESIS_PROFILE": "dev"},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hypothesis profile 'dev'" in r.stdout, r.stdout


def test_ci_and_dev_bound_shrinking_and_the_others_do_not() -> None:
    r = _run(
        """
        import _shardpoint_plugin as plugin
        from hypothesis.internal.conjecture import engine
        own = engine.MAX_SHRINKING_SECONDS
        plugin.load_profile("ci")
        assert engine.MAX_SHRINKING_SECONDS == plugin.SHRINK_SECONDS["ci"] < own
        plugin.load_profile("nightly")
        assert engine.MAX_SHRINKING_SECONDS == own
        plugin.load_profile("dev")
        assert engine.MAX_SHRINKING_SECONDS == plugin.SHRINK_SECONDS["dev"]
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_hypothesis_profile_option_bounds_shrinking_in_pytest(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_bound.py").write_text(
        "from hypothesis.internal.conjecture import engine\n\n"
        "def test_shrinking_is_bounded():\n"
        "    assert engine.MAX_SHRINKING_SECONDS == 10\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-profile=ci"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "SHARDPOINT_HYPOTHESIS_PROFILE"},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
