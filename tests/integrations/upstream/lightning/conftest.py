"""Lightning's own checkpoint tests, run with shardpoint's one line switched on.

``tests_pytorch/`` holds upstream's test files unchanged (Lightning 2.6.5, the release nearest
to the installed 2.6.6, whose only change is in ``core/saving.py``; see docs/INTEGRATIONS.md),
with the few helpers they import. This conftest is the switch: every ``Trainer`` a test builds
gets ``plugins=[ShardpointCheckpointIO()]`` appended, as a user adds the one line, unless the
test chose a ``CheckpointIO`` itself (a ``CheckpointIO`` plugin, or a strategy instance built
with one): a user with their own ``CheckpointIO`` would not add ours.

``SHARDPOINT_UPSTREAM_NATIVE=1`` runs the same tests without the switch (Lightning's own
checkpointing: the baseline the counts in docs/INTEGRATIONS.md compare with).

Tests on the allow-list of docs/INTEGRATIONS.md (they count ``torch.save`` calls or mock
Lightning's ``TorchCheckpointIO``; those that ``torch.load`` a checkpoint file themselves pass
since ``torch.load`` reads shardpoint's files) are marked
``xfail(strict=True)`` here, by node id: each must fail with the switch on (a test that starts
passing fails the run, so the list cannot go stale).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("lightning")

NATIVE = os.environ.get("SHARDPOINT_UPSTREAM_NATIVE") == "1"

#: The allow-list (docs/INTEGRATIONS.md, "Lightning's own tests"): node id prefix -> reason.
_COUNTS_SAVES = "counts torch.save calls (shardpoint saves without torch.save)"
_MOCKS_IO = "mocks TorchCheckpointIO.save_checkpoint to see its arguments"
_PICKLES = (
    "a hyper-parameter only pickle can store (an nn.Module, an fsspec file system): shardpoint "
    "never pickles, so the save raises naming the key and the ignore= way out"
)
_FREQUENCY = "checkpointing/test_checkpoint_callback_frequency.py::"
_MODEL_CKPT = "checkpointing/test_model_checkpoint.py::"
ALLOWED_FAILURES: dict[str, str] = {
    # test function (every parametrization of it) or one parametrization -> why it fails
    _FREQUENCY + "test_default_checkpoint_freq": _COUNTS_SAVES,
    _FREQUENCY + "test_top_k": _COUNTS_SAVES,
    _MODEL_CKPT + "test_model_checkpoint_no_extraneous_invocations": _COUNTS_SAVES,
    "checkpointing/test_trainer_checkpoint.py::test_trainer_save_checkpoint_storage_options": (
        _MOCKS_IO
    ),
    # one parametrization: the others keep their hyper-parameters declaratively
    "models/test_hparams.py::test_collect_init_arguments[AggSubClassBoringModel]": _PICKLES,
    "models/test_hparams.py::test_model_with_fsspec_as_parameter": _PICKLES,
}


def _chose_checkpoint_io(kwargs: dict[str, Any]) -> bool:
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch.strategies import Strategy

    plugins = kwargs.get("plugins")
    if plugins is not None and not isinstance(plugins, list | tuple):
        plugins = [plugins]
    if any(isinstance(p, CheckpointIO) for p in plugins or ()):
        return True
    strategy = kwargs.get("strategy")
    return isinstance(strategy, Strategy) and strategy._checkpoint_io is not None


def _with_shardpoint(init: Any) -> Any:
    from shardpoint.integrations.lightning import ShardpointCheckpointIO

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        if not _chose_checkpoint_io(kwargs):
            plugins = kwargs.get("plugins")
            if plugins is None:
                plugins = []
            elif not isinstance(plugins, list | tuple):
                plugins = [plugins]
            kwargs["plugins"] = [*plugins, ShardpointCheckpointIO()]
        init(self, *args, **kwargs)

    return wrapped


if not NATIVE:
    from shardpoint.integrations import lightning as _sp_lightning

    # What constructing the plugin does, done once before the test modules are imported (as a
    # script builds its Trainer's plugins before loading anything): Lightning's loader then
    # reads shardpoint files wherever it is bound, including the tests' own `pl_load` imports.
    if hasattr(_sp_lightning, "install_reader"):
        _sp_lightning.install_reader()


@pytest.fixture(autouse=True)
def _shardpoint_one_line() -> Iterator[None]:
    # Patched by hand, not with `monkeypatch`: requesting that fixture here would set it up
    # before upstream's autouse fixtures, and its teardown (undoing a test's own setenv) would
    # then come after upstream's check that no test leaks environment variables.
    if NATIVE:
        yield
        return
    from lightning.pytorch import Trainer

    init = Trainer.__init__
    Trainer.__init__ = _with_shardpoint(init)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer.__init__ = init  # type: ignore[method-assign]


#: Ports handed to the tests' process groups: below Linux's ephemeral range (32768-60999), so
#: no outgoing connection is ever given one, and a block of its own per xdist worker.
_PORT_BASE = 20000
_PORTS_PER_WORKER = 800
_next_port = 0


def _free_port() -> int:
    """A port of this worker's block that nothing holds now (not even in TIME_WAIT)."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    for _ in range(_PORTS_PER_WORKER):
        port = _PORT_BASE + (n % 15) * _PORTS_PER_WORKER + _next_port
        _next_port = (_next_port + 1) % _PORTS_PER_WORKER
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {worker}'s block from {_PORT_BASE}")


@pytest.fixture(autouse=True)
def _worker_ports() -> Iterator[None]:
    """Each test's ``find_free_network_port`` (Lightning's ``MASTER_PORT`` for ``ddp_spawn``)
    returns a port of this xdist worker's own block (``STANDALONE_PORT``, which it honours).
    Why: it binds port 0, closes the socket and hands the number on; with tests of several
    workers running, another process's connection took that ephemeral port before the
    process group listened on it (EADDRINUSE in ``test_error_handling_all_stages[ddp_spawn]``,
    once in a fresh clone's run). Set before upstream's ``restore_env_variables`` fixture
    copies the environment, removed after it restored it, so it never looks leaked."""
    old = os.environ.get("STANDALONE_PORT")
    os.environ["STANDALONE_PORT"] = str(_free_port())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("STANDALONE_PORT", None)
        else:
            os.environ["STANDALONE_PORT"] = old


@pytest.fixture(autouse=True)
def _scratch_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run each test in a scratch directory, as upstream's CI runs in a throwaway checkout:
    some write relative to the working directory (tensorboardX writes the logs of
    ``default_root_dir="memory://..."`` to a local folder named ``memory:``)."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(old)


#: The one failure a test is run again for (pytest-rerunfailures, which upstream's CI installs
#: too): a spawned rank killed by ``SIGABRT`` ("terminate called without an active exception")
#: as it exits. Lightning destroys a process group at exit only for NCCL, so a ``ddp_spawn``
#: rank on gloo leaves the group to the interpreter's teardown, where gloo's threads can be
#: destroyed unjoined while the other rank closes its sockets (pytorch/pytorch#65513,
#: #190489): seen once in CI in ``test_trainer_predict_ddp_spawn[cpu]``, a test that writes no
#: checkpoint, after the rank had finished predicting; never in 32 runs of it on a loaded
#: machine here. Any other failure (an assertion, an exception, a rank exiting with a code)
#: fails at once, and a rank aborting three times in a row fails too.
_RANK_ABORTED = r"ProcessExitedException: process \d+ terminated with signal SIGABRT"


@pytest.fixture
def rank_aborted_pattern() -> str:
    """The failure upstream's tests are run again for (tested against a real aborted rank)."""
    return _RANK_ABORTED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests_pytorch/" not in item.nodeid:
            continue
        if item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(reruns=2, only_rerun=[_RANK_ABORTED]))
        if NATIVE:
            continue
        node = item.nodeid.split("tests_pytorch/", 1)[1]
        reason = ALLOWED_FAILURES.get(node, ALLOWED_FAILURES.get(node.split("[", 1)[0]))
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
