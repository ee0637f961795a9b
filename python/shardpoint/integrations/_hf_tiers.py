"""The multi-tier checkpoints of :class:`ShardpointTrainerMixin` (``shardpoint_local_directory=``).

The ``Trainer`` decides where it resumes from a *directory*: ``train(resume_from_checkpoint=
...)`` reads ``trainer_state.json`` there (the global step, from which it computes the epochs
and batches to skip) before any callback runs, then asks ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_scaler`` and ``_load_rng_state`` for the rest. So the
tiers go through the mixin's ``train`` and those methods:

- a :class:`TrainerCallback` saves at ``on_step_end`` (after the optimizer and scheduler
  stepped and ``global_step`` counted it): the model's state dict, the optimizer, scheduler,
  scaler, this process's RNG states and the ``TrainerState`` as JSON, one part per rank, every
  ``local_every`` optimizer steps (the manager's rule), copied into host memory and written in
  the background;
- ``train(resume_from_checkpoint=True)`` restores the newest step complete in any tier (a
  collective), compares it with the newest committed ``checkpoint-N`` of ``output_dir``, and
  resumes from whichever is newer: for the tiers, a directory holding only the restored
  ``trainer_state.json``, whose other parts the mixin's load methods take from memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any

from ..errors import InvalidArgumentError
from ..tiers import TieredCheckpointManager
from ._state import capture_rng, restore_rng
from ._tier_state import TreeState, tier_options

__all__ = ["HFTiers"]

_NAME = "hf_trainer-tiers"
_STATE_FILE = "trainer_state.json"


class HFTiers:
    """The tiered manager of one ``ShardpointTrainer``, opened by ``train`` and closed when it
    returns (saves in flight waited for)."""

    def __init__(self, trainer: Any, local_directory: Any, options: Any) -> None:
        self.trainer = trainer
        self.local_directory = os.fspath(local_directory)
        self.options = tier_options("ShardpointTrainer shardpoint_tiers", options)
        self.manager: TieredCheckpointManager | None = None
        #: the step ``train`` resumed from out of the tiers (None: not from them)
        self.restored_step: int | None = None
        #: where each rank's part came from (``shardpoint.tiers.RestorePlan``)
        self.restore_plan: Any = None
        self.resume_dir: str | None = None
        self._tree: dict[str, Any] | None = None
        self._state = TreeState(self._capture, _NAME)
        self._last_step: int | None = None

    def open(self) -> None:
        """Build the manager (a collective: every rank's ``train`` does it)."""
        if self.manager is not None:
            return
        t = self.trainer
        opts = dict(self.options)
        directory = opts.pop("directory", None) or os.path.join(t.args.output_dir, "tiers")
        self.manager = TieredCheckpointManager(
            self._state, directory, local_directory=self.local_directory, **opts
        )
        self._last_step = None

    def close(self) -> None:
        manager, self.manager = self.manager, None
        try:
            if manager is not None:
                manager.close()
        finally:
            self._tree = None
            if self.resume_dir is not None:
                shutil.rmtree(self.resume_dir, ignore_errors=True)
                self.resume_dir = None

    # -- saving ----------------------------------------------------------------------------------
    def save(self, step: int) -> None:
        """Called at each optimizer step's end; the manager decides whether it is due."""
        if self.manager is None or step <= 0 or step == self._last_step:
            return
        self._last_step = step
        self.manager.save(step)

    def _capture(self) -> dict[str, Any]:
        t = self.trainer
        model = t.accelerator.unwrap_model(t.model, keep_torch_compile=False)
        tree: dict[str, Any] = {
            "model": model.state_dict(),
            "rng": capture_rng(),
            "trainer_state": _state_json(t),
        }
        if t.optimizer is not None:
            tree["optimizer"] = t.optimizer.state_dict()
        if t.lr_scheduler is not None:
            tree["scheduler"] = t.lr_scheduler.state_dict()
        scaler = getattr(t.accelerator, "scaler", None)
        if scaler is not None:
            tree["scaler"] = scaler.state_dict()
        return tree

    # -- resuming --------------------------------------------------------------------------------
    def restore(self) -> int | None:
        """Restore the newest step complete in any tier into memory (a collective); the step or
        None."""
        assert self.manager is not None
        step = self.manager.restore_or_initialize()
        self.restore_plan = self.manager.restore_plan()
        self._tree, self._state.loaded = self._state.loaded, None
        if step is not None:
            self._last_step = step
        return step

    def use_restored(self) -> str:
        """Resume ``train`` from the restored step: a directory with its ``trainer_state.json``
        (what ``Trainer`` reads there itself); the rest comes from :meth:`part`."""
        assert self._tree is not None
        self.restored_step = self._last_step
        self.resume_dir = tempfile.mkdtemp(prefix="shardpoint-tier-resume-")
        with open(os.path.join(self.resume_dir, _STATE_FILE), "w", encoding="utf-8") as f:
            f.write(str(self._tree["trainer_state"]))
        return self.resume_dir

    def drop_restored(self) -> None:
        """The tiers' step is not resumed from (a ``checkpoint-N`` is newer): free its tree."""
        self._tree = None

    def is_resume_dir(self, checkpoint: Any) -> bool:
        return (
            checkpoint is not None
            and self.resume_dir is not None
            and (os.path.abspath(os.fspath(checkpoint)) == os.path.abspath(self.resume_dir))
        )

    def load_model(self, model: Any) -> None:
        model.load_state_dict(self._part("model"), strict=True)

    def load_optimizer_and_scheduler(self) -> None:
        t = self.trainer
        if "optimizer" in self._parts():
            t.optimizer.load_state_dict(self._part("optimizer"))
        if "scheduler" in self._parts():
            t.lr_scheduler.load_state_dict(self._part("scheduler"))

    def load_scaler(self) -> None:
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        if scaler is not None and "scaler" in self._parts():
            scaler.load_state_dict(self._part("scaler"))

    def load_rng(self) -> None:
        restore_rng(self._part("rng"))

    def _parts(self) -> dict[str, Any]:
        if self._tree is None:
            raise InvalidArgumentError(
                f"{self.resume_dir}: the tiers' restored state was already released"
            )
        return self._tree

    def _part(self, name: str) -> Any:
        """Part ``name`` of the restored step, released here: once the Trainer has loaded it,
        the copy is not kept for the rest of training."""
        parts = self._parts()
        if name not in parts:
            raise InvalidArgumentError(
                f"the tiers' step {self.restored_step} holds no {name} (or it was loaded already)"
            )
        return parts.pop(name)


def _state_json(t: Any) -> str:
    """``TrainerState`` as ``trainer_state.json`` holds it, the callbacks' states included as
    ``_save_checkpoint`` records them; the ``TrainerControl`` flags fresh: what they asked for
    at this step (log, save, evaluate) is this step's, not the resumed run's first step's."""
    from transformers.trainer_callback import ExportableState, TrainerControl

    found: dict[str, list[Any]] = {}
    for cb in [*t.callback_handler.callbacks, t.control]:
        if isinstance(cb, ExportableState):
            state = TrainerControl().state() if isinstance(cb, TrainerControl) else cb.state()
            found.setdefault(type(cb).__name__, []).append(state)
    snapshot = dataclasses.replace(t.state)
    snapshot.stateful_callbacks = {k: v[0] if len(v) == 1 else v for k, v in found.items()}
    return json.dumps(dataclasses.asdict(snapshot), indent=2, sort_keys=True) + "\n"


def saving_callback(tiers: HFTiers) -> Any:
    """A ``TrainerCallback`` calling ``tiers.save(global_step)`` at each optimizer step's end."""
    from transformers import TrainerCallback

    class ShardpointTierSaves(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            tiers.save(int(state.global_step))

    return ShardpointTierSaves()
