"""Shared pytest setup: the test suite's own helper modules live at tests/ (``reference_reader``,
``reliability_helpers``), imported by tests in the subfolders (tests/storage, tests/reliability,
...). Put tests/ on sys.path explicitly so that holds under any pytest import mode.

The subfolders have no ``__init__.py`` (``tests/torch`` as a package would shadow PyTorch), so
test file names must be unique across the whole tree.
"""

from __future__ import annotations

import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# `make test` sets SHARDPOINT_REQUIRE_OPTIONAL=1: there the optional integrations (torch, jax,
# orbax, huggingface_hub, safetensors, moto) are installed by the Makefile and their tests must
# run, so a missing one fails the run here instead of being skipped by an importorskip.
_REQUIRED_IN_CI = (
    "torch",
    "jax",
    "orbax.checkpoint",
    "huggingface_hub",
    "safetensors",
    "moto",
    # the trainer integrations' frameworks (tests/integrations)
    "lightning",
    "transformers",
    "accelerate",
    "deepspeed",
    "peft",
    "parameterized",
    "model_signing",
    # OmegaConf configs in checkpoints (FORMAT.md §6.1)
    "omegaconf",
    # the view page's browser test
    "selenium",
    # PyTorch's own DCP tests (tests/integrations/upstream/torch_dcp): torch.testing._internal
    "expecttest",
)


def pytest_sessionstart(session: object) -> None:
    """Refuse to run a partial suite in CI: every optional integration must import."""
    if os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") != "1":
        return
    import importlib

    missing = []
    for name in _REQUIRED_IN_CI:
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing.append(f"{name} ({e})")
    if missing:
        raise RuntimeError(
            "SHARDPOINT_REQUIRE_OPTIONAL=1 but these test dependencies do not import: "
            + ", ".join(missing)
        )


@pytest.fixture(autouse=True)
def _torch_deterministic_mode_reset():
    """Lightning's ``Trainer(deterministic=True)`` (in-process runs in tests/integrations) turns
    on torch's deterministic algorithms for the whole process, and then ``torch.empty`` of
    float4 dtypes raises in every later test. Give each test torch's default back."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(False)


# Tests that must not share the machine's processes with each other: the multi-process runs
# (DeepSpeed/Lightning/accelerate/torch.distributed ranks on gloo, each rank a process) and the
# GIL-release measurements. Under `pytest -n N --dist loadgroup` (make test) every test of one
# group runs on one worker, in order, so two of them never compete.
SERIAL_GROUPS = {
    "multiprocess": (
        "test_deepspeed_integration.py",
        "test_deepspeed_multirank.py",
        "test_torch_distributed.py",
        "test_lightning_ddp.py",
        "test_accelerate_multiprocess.py",
        "test_tiers_multiprocess.py",
        "test_reader_pickle.py",  # DataLoaders with spawned and forkserver workers
        "test_lightning_tiers_ddp.py",
        "test_tiers_dcp.py",
        "test_accelerate_tiers_ddp.py",
        "test_hf_trainer_tiers_ddp.py",
        "test_deepspeed_tiers.py",
        "test_rank_death.py",
        "test_shared_listings.py",
        "test_gc_uploads.py",
        "test_merge_race.py",
        "test_dcp_finish_race.py",
        "test_tiers_lock.py",
        "test_file_system_checkpoint_cpu.py",  # PyTorch's own DCP tests, 2 gloo ranks
    ),
    "timing": ("test_gil.py",),
}
_GROUP_OF_FILE = {name: group for group, names in SERIAL_GROUPS.items() for name in names}
# The longest units of work (minutes each on 2 cores), handed out first so that none of them
# starts last and runs on alone at the end; the rest go largest-first by test count (xdist).
LONGEST_FIRST = (
    "multiprocess",
    "test_keras_backends.py",
    "test_hf_trainer_integration.py",
    "test_docs_examples.py",
    "test_vllm_loader.py",
)


def scheduling_group(nodeid: str) -> str:
    """The unit of work a test belongs to under ``--dist loadgroup``: its file, or the serial
    group its file is named in (SERIAL_GROUPS)."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF_FILE.get(path.rsplit("/", 1)[-1], path)


# Why a scheduler of our own and not `xdist_group` marks: xdist (3.8) carries a mark's group to
# the controller by appending "@group" to `item._nodeid` on the worker, and pytest 9.2 reads the
# node id from elsewhere, so the marks were silently dropped and every test was scheduled alone
# (module fixtures built on both workers; a file's tests split across them). The controller
# only ever sees node ids, so the grouping is computed from them, through xdist's public hook.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Undo what importing ``torch.testing._internal.common_utils`` does to the whole process
    (PyTorch's own DCP tests import it, tests/integrations/upstream/torch_dcp, and collection
    imports every test module in every worker): it freezes the global cudnn flags, and every
    later ``Trainer(deterministic=...)`` in that process then raised "not allowed to set
    torch.backends.cudnn flags after disable_global_flags"."""
    backends = sys.modules.get("torch.backends")
    frozen = getattr(backends, "flags_frozen", None)
    if frozen is not None and frozen():
        # the flag is a global of the function's own module dict (torch wraps the module)
        frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadgroup``: schedule whole groups (scheduling_group) on one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_group(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            for name in reversed(LONGEST_FIRST):
                for scope in [s for s in self.workqueue if s.rsplit("/", 1)[-1] == name]:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return FileGroupScheduling(config, log)
