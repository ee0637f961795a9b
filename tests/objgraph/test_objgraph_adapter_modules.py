"""Adapter modules declared for a framework (``declare_adapter_module``), without torch: a fake
framework package and a fake adapter module written to tmp_path (issue 22: the torch adapters
were found only for objects whose own class came from torch, too late for user subclasses)."""

from __future__ import annotations

import sys
import textwrap
import types

import pytest

from shardpoint.objgraph import trackable
from shardpoint.objgraph.state_dict_adapter import StateDictTrackable


class _Stateful:
    def state_dict(self):
        return {"a": 1}

    def load_state_dict(self, state):
        pass


@pytest.fixture
def fake_framework(tmp_path, monkeypatch):
    """``fakefw`` (a framework with a base class) and ``fakefw_adapters`` (registers a built-in
    adapter for it on import), declared as torch is; registries restored afterwards."""
    framework = types.ModuleType("fakefw")
    base = type("Base", (_Stateful,), {"__module__": "fakefw"})
    framework.Base = base
    (tmp_path / "fakefw_adapters.py").write_text(
        textwrap.dedent(
            """
            import fakefw
            from shardpoint.objgraph.trackable import Trackable, register_builtin_adapter

            class FakeAdapter(Trackable):
                def __init__(self, obj):
                    self.obj = obj

            register_builtin_adapter(fakefw.Base, FakeAdapter)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(trackable, "_ADAPTER_MODULES", {})
    monkeypatch.setattr(trackable, "_FAILED", {})
    monkeypatch.setattr(trackable, "_BUILTIN_ADAPTERS", list(trackable._BUILTIN_ADAPTERS))
    monkeypatch.delitem(sys.modules, "fakefw_adapters", raising=False)
    trackable.declare_adapter_module("fakefw", "fakefw_adapters")
    yield framework, base
    sys.modules.pop("fakefw_adapters", None)


def test_subclass_defined_outside_the_framework_gets_its_adapter(fake_framework, monkeypatch):
    framework, base = fake_framework

    class UserThing(base):  # defined here, in the test module: not a "fakefw" class itself
        pass

    # framework not imported: nothing is imported, the generic adapter answers
    assert isinstance(trackable.as_trackable(_Stateful()), StateDictTrackable)
    assert "fakefw_adapters" not in sys.modules
    monkeypatch.setitem(sys.modules, "fakefw", framework)
    adapter = trackable.as_trackable(UserThing())
    assert type(adapter).__name__ == "FakeAdapter"
    assert trackable._ADAPTER_MODULES == {}  # imported once


def test_user_adapter_wins_over_a_lazily_imported_builtin(fake_framework, monkeypatch):
    framework, base = fake_framework

    class Mine(trackable.Trackable):
        def __init__(self, obj):
            self.obj = obj

    trackable.register_trackable_adapter(base, Mine)  # before the built-in one is imported
    try:
        monkeypatch.setitem(sys.modules, "fakefw", framework)
        assert isinstance(trackable.as_trackable(base()), Mine)
    finally:
        trackable.unregister_trackable_adapter(Mine)


def test_failed_adapter_import_refuses_only_that_frameworks_objects(fake_framework, monkeypatch):
    framework, base = fake_framework
    monkeypatch.setitem(sys.modules, "fakefw", framework)
    monkeypatch.setitem(trackable._ADAPTER_MODULES, "fakefw", "fakefw_adapters_missing")

    class UserThing(base):
        pass

    with pytest.raises(ImportError, match="fakefw_adapters_missing .* failed to import") as info:
        trackable.as_trackable(UserThing())
    assert isinstance(info.value.__cause__, ImportError)
    # not a silent generic adapter for the framework's objects, but others still track
    assert isinstance(trackable.as_trackable(_Stateful()), StateDictTrackable)
    with pytest.raises(ImportError):
        trackable.as_trackable(base())
