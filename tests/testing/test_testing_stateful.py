"""CheckpointManagerMachine on our own CheckpointManager: local directories (faults: a file
size limit hit part-way through a save) and the moto S3 server (faults: a request refused
part-way through, by the proxy in front of it). And the machine is not vacuous: managers
with planted bugs fail it."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

import shardpoint as sp
from kit_budget import scaled, steps
from shardpoint.testing.stateful import CheckpointManagerMachine


def machine_settings(runs: float, at_most_steps: int) -> settings:
    return settings(
        max_examples=scaled(runs, at_least=3),
        stateful_step_count=steps(at_most_steps),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


class LocalMachine(CheckpointManagerMachine):
    pass


TestLocalManager = LocalMachine.TestCase
TestLocalManager.settings = machine_settings(0.08, 15)


def test_manager_machine_on_s3(moto: Any, proxy: Any) -> None:
    bucket = moto.bucket()

    class S3Machine(CheckpointManagerMachine):
        def make_directory(self) -> str:
            return f"s3://{bucket}/run-{uuid.uuid4().hex[:8]}"

        def inject_fault(self, data: Any) -> Any:
            n = data.draw(st.integers(0, 10), label="requests before the refused one")

            @contextlib.contextmanager
            def refuse_one() -> Any:
                proxy.fail_after(n, "403")
                try:
                    yield
                finally:
                    proxy.fail_next(0, "403")

            return refuse_one()

    run_state_machine_as_test(S3Machine, settings=machine_settings(0.03, 10))


class _ForgetsRetention(sp.CheckpointManager):
    """Lists every checkpoint: retention never applied."""

    def __init__(self, checkpoint: Any, directory: str, max_to_keep: Any = 5, **kw: Any) -> None:
        super().__init__(checkpoint, directory, max_to_keep=None, **kw)


class _ListsTooEarly(sp.CheckpointManager):
    """Names its checkpoint before the save committed: a failed save stays listed."""

    def save(self, checkpoint_number: Any = None, *args: Any, **kw: Any) -> Any:
        path = f"{self._prefix}-{checkpoint_number}"
        self._maybe_delete[path] = 0.0
        return super().save(checkpoint_number, *args, **kw)


@pytest.mark.parametrize("broken", [_ForgetsRetention, _ListsTooEarly])
def test_a_broken_manager_fails_the_machine(broken: type) -> None:
    class Broken(CheckpointManagerMachine):
        max_to_keep = st.integers(1, 2)

        def make_manager(self, checkpoint: Any, directory: str, max_to_keep: Any) -> Any:
            return broken(checkpoint, directory, max_to_keep=max_to_keep)

    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            Broken,
            settings=settings(
                machine_settings(0.3, 20),
                phases=[p for p in settings.default.phases if p.name != "shrink"],
            ),
        )
