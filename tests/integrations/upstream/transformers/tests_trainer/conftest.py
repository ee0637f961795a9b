"""transformers' own Trainer checkpoint tests, run with shardpoint's one line switched on.

The two modules beside this file are transformers' ``tests/trainer/test_trainer_checkpointing.py``
and the helper module it imports, ``tests/trainer/trainer_test_utils.py``, copied unchanged
(upstream headers and assertions as they are) from huggingface/transformers at commit
22c22fa26f5f3352d243bc358f0947af05b1d61b (the test file) and 2d754248977f8e25edd8cd4d6d272e86f362d4a5
(the helper). The repository's mirror is too large to fetch, so no v5.24.0 tag could be checked
out; of the stored versions this one matches the installed 5.24.0: an earlier one
(abee4b14abf32637fe72990d0c409eaba189b31a) fails two best-model tests natively because 5.24
changed the behaviour they check, and the Hub-bucket tests this one adds are staging tests
(skipped, as every Hub test here). The package is named
``tests_trainer`` (upstream: ``tests/trainer``) so that its relative import works without a
top-level package called ``tests``.

The one line a user changes is ``Trainer(...)`` -> ``ShardpointTrainer(...)``. Here it is
``transformers.Trainer`` replaced by ``ShardpointTrainer`` while the two modules are imported
(they bind ``Trainer`` at import) and during each of their tests (``JITCheckpointTest`` imports
it inside a test); every other test module of the suite keeps the real class.
``SHARDPOINT_UPSTREAM_NATIVE=1`` leaves the switch off, to count the native results.
Tests on the allow-list of docs/INTEGRATIONS.md are marked ``xfail(strict=True)`` with the
exception they must raise (each with its reason): a fix shows up as an unexpected pass. Tests that
fail in this sandbox with the real ``Trainer`` too (``NATIVE_FAILURES``: they download models from
the Hugging Face Hub, which is unreachable here, or hit a DeepSpeed bug on CPU) are skipped with
that reason, in both modes.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

_NATIVE = os.environ.get("SHARDPOINT_UPSTREAM_NATIVE") == "1"

#: test name -> the reason it cannot pass with shardpoint (docs/INTEGRATIONS.md, allow-list):
#: empty since the checkpoints hold optimizer.pt, scheduler.pt, rng_state.pth and
#: training_args.bin under Trainer's names (shardpoint single files)
ALLOWED: dict[str, str] = {}
_HUB = "fails with the real Trainer too: downloads {} from the Hugging Face Hub (no network here)"
#: test name -> why it fails in this sandbox whatever the checkpoint format
NATIVE_FAILURES: dict[str, str] = {
    "test_save_collator_tokenizer_by_default": _HUB.format("bert-base-uncased"),
    "test_multiple_peft_adapters": _HUB.format("hf-internal-testing/tiny-random-LlamaForCausalLM"),
    "test_trainer_saves_tokenizer": _HUB.format("google-bert/bert-base-uncased"),
    "test_trainer_saves_feature_extractor": _HUB.format("facebook/wav2vec2-base-960h"),
    "test_auto_batch_size_with_deepspeed": (
        "fails with the real Trainer too: DeepSpeed 0.19.8 cannot start without a launcher "
        "(mpi4py missing) and, given one, fails on the test model's 0-dim parameters "
        "('self.dim() cannot be 0 to view Float as Byte')"
    ),
}


def _shardpoint_trainer() -> type:
    from shardpoint.integrations.hf_trainer import ShardpointTrainer

    return ShardpointTrainer


def _transformers() -> object:
    """The module ``from transformers import ...`` reads: transformers' lazy module replaces
    itself in ``sys.modules`` the first time one of its names is resolved, so the object
    ``import transformers`` bound before that is not the one later imports see."""
    import transformers

    transformers.Trainer  # noqa: B018 - resolves the lazy name, settling sys.modules
    return sys.modules["transformers"]


def _import_switched() -> None:
    """Import the upstream modules with the switch on, so their module-level ``Trainer``
    (and ``CustomDataloaderTrainer``'s base) is shardpoint's."""
    module = _transformers()
    real = module.Trainer  # type: ignore[attr-defined]
    module.Trainer = _shardpoint_trainer()  # type: ignore[attr-defined]
    try:
        for name in ("trainer_test_utils", "test_trainer_checkpointing"):
            importlib.import_module(f"{__package__}.{name}")
    finally:
        module.Trainer = real  # type: ignore[attr-defined]


if not _NATIVE:
    _import_switched()


@pytest.fixture(autouse=True)
def _one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _NATIVE:
        monkeypatch.setattr(_transformers(), "Trainer", _shardpoint_trainer())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if not str(item.path).startswith(here):
            continue
        if item.name in NATIVE_FAILURES:
            item.add_marker(pytest.mark.skip(reason=NATIVE_FAILURES[item.name]))
        elif item.name in ALLOWED and not _NATIVE:
            mark = pytest.mark.xfail(reason=ALLOWED[item.name], raises=AssertionError, strict=True)
            item.add_marker(mark)
