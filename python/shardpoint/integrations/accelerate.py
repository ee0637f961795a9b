"""accelerate: use :class:`ShardpointAccelerator` where you used ``Accelerator``.

``save_state``/``load_state`` then store everything accelerate stores. Each prepared model's
weights are written as accelerate names them — ``model.safetensors``, ``model_1.safetensors``...
— by shardpoint's writer (:mod:`._weights_io`), so every reader of those files still reads them;
every optimizer, scheduler, the samplers/stateful dataloaders, the ``GradScaler``, the RNG states
(Python, numpy, torch CPU/CUDA) with ``accelerator.step``, and every object given to
``register_for_checkpointing`` go into one compressed shardpoint checkpoint ``shardpoint.index`` +
``shardpoint.data-*`` (plus ``rng_<i>`` per process when there are several) that also records
each weight tensor's crc32c, checked by ``load_state`` — instead of ``optimizer.bin``,
``scheduler.bin``, ``random_states_0.pkl``, ``custom_checkpoint_0.pkl``... (pickles).
``shardpoint_weights="compressed"`` keeps the weights in the part too. ``ProjectConfiguration(
automatic_checkpoint_naming=True, total_limit=k)`` naming and rotation are kept, and the
``register_save_state_pre_hook``/``register_load_state_pre_hook`` hooks still run (a hook that
removes a model from the list takes over that model's weights, as with accelerate).

Why a subclass: accelerate's pre-hooks only reach model weights (optimizer, scheduler, RNG and
custom objects are pickled after them by ``save_accelerator_state``), so the two methods that
write and read a checkpoint are overridden; everything else is ``Accelerator``'s. FSDP,
DeepSpeed, Megatron-LM and XLA runs, whose checkpoints those frameworks write, use
``Accelerator``'s own code.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, InvalidArgumentError
from ._hf_weights import plan_state_dict, warn_kept
from ._state import (
    PendingSaves,
    capture_rng,
    has_part,
    load_tree,
    module_targets,
    part_prefix,
    restore_rng,
    save_tree,
)
from ._tier_state import TierRun, tier_options
from ._weights_io import WeightsGroup, load_group, read_manifest, save_with_weights

if TYPE_CHECKING:
    ShardpointAccelerator: type  # built on first use (module __getattr__): subclasses Accelerator

__all__ = ["ShardpointAccelerator", "ShardpointAcceleratorMixin", "load_checkpoint"]

_PART = "shardpoint"
_NAME = "accelerate"
_NUMBER = re.compile(r"[\/]?([0-9]+)(?=[^\/]*$)")


def _accelerate() -> Any:
    try:
        import accelerate
    except ImportError as exc:
        raise ImportError(
            "shardpoint.integrations.accelerate needs accelerate: "
            "pip install 'shardpoint[accelerate]'"
        ) from exc
    return accelerate


def load_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything ``save_state`` stored in ``checkpoint_dir``: ``models`` (from the weights
    files, each tensor checked against its crc32c, or from the part), ``optimizers``,
    ``schedulers``, ``dataloaders``, ``scaler``, ``custom`` (lists in registration order),
    ``rng`` and ``step``; tensors on the CPU."""
    root = os.fspath(checkpoint_dir)
    tree = dict(load_tree(part_prefix(root, _PART), integration=_NAME))
    manifest = read_manifest(part_prefix(root, _PART), _NAME)
    if manifest is not None:
        by_file = {g["files"][0]: g for g in manifest["groups"]}
        tree["models"] = [
            load_group(root, by_file[_weights_name(i)]) for i in range(len(tree["models"]))
        ]
    return tree


def _weights_name(i: int) -> str:
    """accelerate's file name of the ``i``-th model's weights."""
    return "model.safetensors" if i == 0 else f"model_{i}.safetensors"


def _number(folder: str) -> int:
    found = _NUMBER.findall(folder)
    return int(found[0]) if found else -1


class ShardpointAcceleratorMixin:
    """Put in front of ``Accelerator``: ``save_state``/``load_state`` through shardpoint.

    Extra constructor keywords: ``shardpoint_blocking`` (default True; ``False`` returns from
    ``save_state`` once the state is snapshotted and writes it in the background: the next
    ``save_state``, ``load_state`` and :meth:`wait_for_saves` wait for it),
    ``shardpoint_compression`` (``"zstd"``), ``shardpoint_level``, ``shardpoint_weights``
    (``"safetensors"``, default: the weights files accelerate writes; ``"compressed"``: in the
    part, smaller, read by shardpoint only).

    ``shardpoint_local_directory`` (node-local: tmpfs or NVMe) turns the multi-tier
    checkpoints on (docs/TIERS.md): ``save_state()`` without a directory, called once per
    step, counts the step (``project_configuration.iteration``) and every ``local_every`` (10)
    steps saves each process's whole state there and to a peer node, every
    ``persistent_every`` (1000) also to the persistent tier (``directory``, default
    ``<project_dir>/tiers``), in the background; ``load_state()`` without a directory restores
    the newest step complete in any tier and returns it (None: nothing saved yet, a fresh
    start). ``shardpoint_tiers``: a dict of ``TieredCheckpointManager`` arguments.
    ``wait_for_saves()`` / ``end_training()`` wait for the saves in flight.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sp_weights = kwargs.pop("shardpoint_weights", "safetensors")
        if self._sp_weights not in ("safetensors", "compressed"):
            raise InvalidArgumentError(
                f"shardpoint_weights must be 'safetensors' or 'compressed', got {self._sp_weights!r}"
            )
        self._sp_blocking = bool(kwargs.pop("shardpoint_blocking", True))
        self._sp_compression = kwargs.pop("shardpoint_compression", "zstd")
        self._sp_level = kwargs.pop("shardpoint_level", None)
        self._sp_pending = PendingSaves()
        local = kwargs.pop("shardpoint_local_directory", None)
        tier_opts = tier_options("ShardpointAccelerator", kwargs.pop("shardpoint_tiers", None))
        if tier_opts and local is None:
            raise InvalidArgumentError("shardpoint_tiers needs shardpoint_local_directory")
        super().__init__(*args, **kwargs)
        #: the multi-tier checkpoints (``shardpoint_local_directory``), or None
        self.shardpoint_tiers: TierRun | None = None
        if local is not None:
            self.shardpoint_tiers = TierRun(
                self._sp_tier_tree, "accelerate-tiers", local, tier_opts, self._sp_tier_dir
            )

    def _sp_tier_tree(self) -> dict[str, Any]:
        a: Any = self
        models = [a.unwrap_model(m).state_dict() for m in a._models]
        return state_tree(a, models, capture_rng())

    def _sp_tier_dir(self) -> str | None:
        a: Any = self
        return os.path.join(a.project_dir, "tiers") if a.project_dir else None

    def _sp_tiers_on(self, directory: Any) -> TierRun | None:
        """The tiers, when a ``save_state``/``load_state`` call without a directory uses them."""
        tiers = self.shardpoint_tiers
        if tiers is None or directory is not None:
            return None
        if self._sp_native():
            raise InvalidArgumentError(
                "shardpoint_local_directory: the tiers save each process's whole state, which "
                "FSDP, DeepSpeed, Megatron-LM and XLA runs partition themselves; not supported "
                "with them yet"
            )
        return tiers

    def end_training(self) -> None:
        """``Accelerator.end_training``, after the saves in flight (the tiers' too)."""
        try:
            self.wait_for_saves()
        finally:
            if self.shardpoint_tiers is not None:
                self.shardpoint_tiers.close()
            super().end_training()  # type: ignore[misc]  # a mixin: the base comes after it in the MRO

    def wait_for_saves(self) -> None:
        """Block until every ``shardpoint_blocking=False`` save has committed (raises the error
        of a failed one), and the tiers' saves in flight."""
        self._sp_pending.wait()
        if self.shardpoint_tiers is not None:
            self.shardpoint_tiers.wait()

    def _sp_native(self) -> bool:
        from accelerate.utils import DistributedType

        a: Any = self
        return a.distributed_type in (
            DistributedType.FSDP,
            DistributedType.DEEPSPEED,
            DistributedType.MEGATRON_LM,
            DistributedType.XLA,
        )

    def _sp_checkpoints_dir(self) -> str:
        a: Any = self
        return os.path.join(a.project_dir, "checkpoints")

    def save_state(
        self, output_dir: str | None = None, safe_serialization: bool = True, **kwargs: Any
    ) -> Any:
        """``Accelerator.save_state``, every part stored through shardpoint. With the tiers on
        and no ``output_dir``: count a step and save it to the tiers when due (a future of
        its local commit, else None)."""
        tiers = self._sp_tiers_on(output_dir)
        if tiers is not None:
            config = self.project_configuration  # type: ignore[attr-defined]  # Accelerator's
            config.iteration += 1
            return tiers.save(config.iteration)
        if self._sp_native():
            return super().save_state(output_dir, safe_serialization, **kwargs)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        a: Any = self
        # rotation below must not delete a checkpoint still being written in the background
        self._sp_pending.wait()
        config = a.project_configuration
        if config.automatic_checkpoint_naming:
            root = self._sp_checkpoints_dir()
            os.makedirs(root, exist_ok=True)
            folders = sorted((os.path.join(root, f) for f in os.listdir(root)), key=_number)
            limit = config.total_limit
            if limit is not None and len(folders) + 1 > limit and a.is_main_process:
                for folder in folders[: len(folders) + 1 - limit]:
                    shutil.rmtree(folder)
            output_dir = os.path.join(root, f"checkpoint_{a.save_iteration}")
            # a killed save of ours leaves no part; accelerate's own checkpoint (from before
            # the one line) is complete without one and is refused as accelerate refuses it
            leftover = (
                os.path.isdir(output_dir)
                and not has_part(output_dir, _PART)
                and not _native_checkpoint(output_dir)
            )
            if leftover and a.is_main_process:
                # what a save killed before its commit left: not a checkpoint, replaced
                shutil.rmtree(output_dir)
            # (another process may look before the main one removed a leftover: not an error)
            if os.path.exists(output_dir) and not leftover:
                raise ValueError(
                    f"Checkpoint directory {output_dir} ({a.save_iteration}) already exists. "
                    "Please manually override `self.save_iteration` with what iteration to start "
                    "with."
                )
            a.wait_for_everyone()
        if output_dir is None:
            raise InvalidArgumentError("save_state needs output_dir (or automatic naming)")
        output_dir = os.fspath(output_dir)
        os.makedirs(output_dir, exist_ok=True)
        if a.is_main_process:
            _remove_native_states(output_dir)
        weights = [a.get_state_dict(m, unwrap=False) for m in a._models]
        for hook in a._save_model_state_pre_hook.values():
            hook(a._models, weights, output_dir)
        rng = capture_rng()
        writes = a.is_main_process or config.save_on_each_node and a.is_local_main_process
        groups = self._sp_groups(weights) if writes else None
        if writes:
            # with the weights in their files, the part keeps one slot per model
            tree = state_tree(a, weights if groups is None else [None] * len(weights), rng)
            self._sp_save(tree, part_prefix(output_dir, _PART), groups, output_dir)
        if a.num_processes > 1:  # every process's generators
            self._sp_save(rng, part_prefix(output_dir, f"rng_{a.process_index}"))
        config.iteration += 1
        return output_dir

    def _sp_groups(self, weights: list[Any]) -> list[WeightsGroup] | None:
        """Each model's weights file, or ``None`` when the weights stay in the part."""
        if self._sp_weights != "safetensors":
            return None
        groups = [plan_state_dict(dict(w), _weights_name(i)) for i, w in enumerate(weights)]
        if any(g is None for g in groups):
            warn_kept("accelerate", "a model's state dict holds values that are not tensors")
            return None
        return [g for g in groups if g is not None]

    def _sp_save(
        self,
        tree: Any,
        prefix: str,
        groups: list[WeightsGroup] | None = None,
        root: str | None = None,
    ) -> None:
        options: dict[str, Any] = {
            "integration": _NAME,
            "blocking": self._sp_blocking,
            "compression": self._sp_compression,
            "level": self._sp_level,
        }
        if groups is not None and root is not None:
            fut = save_with_weights(root, prefix, tree, groups, **options)
        else:
            fut = save_tree(tree, prefix, **options)
        if fut is not None:
            self._sp_pending.add(prefix, fut)

    def load_state(
        self, input_dir: str | None = None, load_kwargs: dict[str, Any] | None = None, **kw: Any
    ) -> int | None:
        """``Accelerator.load_state`` of a directory written by :meth:`save_state`. With
        automatic naming and no ``input_dir``, the newest checkpoint whose shardpoint index
        was committed (a save killed mid-way leaves a directory without one). With the tiers
        on and no ``input_dir``: the newest step complete in any tier, returned (None: no
        tier holds one; nothing is changed)."""
        tiers = self._sp_tiers_on(input_dir)
        if tiers is not None:
            step, tree = tiers.restore()
            if step is None or tree is None:
                return None
            apply_state(self, tree, tree["rng"], f"the tiers' step {step}")
            self.project_configuration.iteration = step  # type: ignore[attr-defined]  # Accelerator's
            return step
        if self._sp_native():
            return super().load_state(input_dir, load_kwargs, **kw)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        self._sp_pending.wait()
        a: Any = self
        if input_dir is not None:
            input_dir = os.path.expanduser(os.fspath(input_dir))
            if not os.path.isdir(input_dir):
                raise ValueError(f"Tried to find {input_dir} but folder does not exist")
        elif a.project_configuration.automatic_checkpoint_naming:
            root = self._sp_checkpoints_dir()
            done = [os.path.join(root, f) for f in os.listdir(root)]
            done = [f for f in done if has_part(f, _PART) or _native_checkpoint(f)]
            done = sorted(done, key=_number)
            if not done:
                raise CheckpointError(f"accelerate: no committed checkpoint under {root!r}")
            input_dir = done[-1]
        else:
            raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")
        if _native_checkpoint(input_dir) and not _part_is_newer(input_dir):
            # accelerate's own checkpoint, saved before the one line was added (or over one
            # of ours, by a plain Accelerator): its own code, as a plain load_state reads it
            return super().load_state(input_dir, load_kwargs, **kw)  # type: ignore[misc]  # a mixin
        load_directory(a, input_dir, kw.get("strict", True))
        return None


#: the state files accelerate's own ``save_state`` writes (``optimizer.bin``,
#: ``random_states_0.pkl``, ``pytorch_model_1.bin``, ``custom_checkpoint_0.pkl``...)
_NATIVE_STATES = re.compile(
    r"(optimizer|scheduler|sampler|dl_state_dict|pytorch_model)(_\d+)?\.bin"
    r"|model(_\d+)?\.safetensors|random_states_\d+\.pkl|custom_checkpoint_\d+\.pkl|scaler\.pt"
)


def _native_checkpoint(directory: str) -> bool:
    """Whether ``directory`` is a checkpoint accelerate's own ``save_state`` wrote (its RNG
    states file is there)."""
    try:
        return any(n.startswith("random_states_") for n in os.listdir(directory))
    except OSError:
        return False


def _part_is_newer(directory: str) -> bool:
    """Whether our part was committed after accelerate's RNG states file was written (both
    are there when a plain ``Accelerator`` and ours saved into the same directory)."""
    index = part_prefix(directory, _PART) + ".index"
    try:
        ours = os.path.getmtime(index)
        theirs = max(
            os.path.getmtime(os.path.join(directory, n))
            for n in os.listdir(directory)
            if n.startswith("random_states_")
        )
    except (OSError, ValueError):
        return os.path.exists(index)
    return ours >= theirs


def _remove_native_states(directory: str) -> None:
    """Remove accelerate's own state files from a directory this save writes into (a
    ``save_state(dir)`` of before the one line). accelerate would have overwritten them; left
    there, a plain ``Accelerator.load_state`` would read them, not this save: the new weights
    with the old optimizer, scheduler and RNG, silently."""
    for name in os.listdir(directory):
        if _NATIVE_STATES.fullmatch(name) and os.path.isfile(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))


def load_directory(a: Any, input_dir: str, strict: bool = True) -> None:
    """Load the checkpoint directory ``input_dir`` that :meth:`save_state` wrote into
    accelerator ``a`` (a ``ShardpointAccelerator``, or a plain ``Accelerator`` through the
    front ``_shardpoint_loaders/accelerator_state.py`` installs): the load pre-hooks run
    first, then every model (its weights file, each tensor checked, or the part), optimizer,
    scheduler, dataloader, scaler, registered object, RNG state and the step."""
    models = list(a._models)
    for hook in a._load_model_state_pre_hook.values():
        hook(models, input_dir)
    ours = [any(model is m for m in models) for model in a._models]  # hooks take some over
    manifest = read_manifest(part_prefix(input_dir, _PART), _NAME)
    files_of = {g["files"][0]: g for g in manifest["groups"]} if manifest else {}

    def targets(skeleton: Any) -> dict[str, Any]:
        # counts first: a mismatch is refused before any parameter is written
        if skeleton is not None:
            _check_counts(skeleton, a, input_dir)
        return {
            "models": [
                module_targets(a.unwrap_model(m)) if mine and manifest is None else None
                for m, mine in zip(a._models, ours, strict=True)
            ],
            # every optimizer's state is loaded below: the tensors it already holds
            # (after a step) receive the stored values in place
            "optimizers": [o.state_dict() for o in a._optimizers],
        }

    tree = dict(load_tree(part_prefix(input_dir, _PART), integration=_NAME, into=targets))
    _check_counts(tree, a, input_dir)
    for i, model in enumerate(a._models):
        if not ours[i]:
            tree["models"][i] = None
        elif manifest is not None:  # the model's weights file, each tensor checked
            group = files_of.get(_weights_name(i))
            if group is None:
                raise CheckpointError(
                    f"accelerate: checkpoint {input_dir!r} records no {_weights_name(i)}"
                )
            module = a.unwrap_model(model)
            state = load_group(input_dir, group, module_targets(module))
            tree["models"][i] = _with_tied_names(module, state)
    rng = tree["rng"]
    if a.num_processes > 1:
        rng = load_tree(part_prefix(input_dir, f"rng_{a.process_index}"), integration=_NAME)
    apply_state(a, tree, rng, input_dir, strict)


def _with_tied_names(module: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` read from a weights file, with the tied names it leaves out put back. Like
    accelerate's ``model.safetensors``, the file keeps one name of each group of parameters
    sharing memory (``linear2.weight = linear1.weight``); accelerate loads it with
    safetensors' ``load_model``, which forgives those missing names, and a strict
    ``load_state_dict`` would not. A name is filled in only from a tie the live module has."""
    from ..torch.tied import _tied_groups

    out = dict(state)
    for names in _tied_groups(module.state_dict(keep_vars=True)):
        present = [n for n in names if n in out]
        for n in names:
            if present and n not in out:
                out[n] = out[present[0]]
    return out


def apply_state(a: Any, tree: dict[str, Any], rng: Any, source: str, strict: bool = True) -> None:
    """Put a saved state (``save_state``'s tree: ``models``, ``optimizers``, ``schedulers``,
    ``dataloaders``, ``scaler``, ``custom``, ``step``) back into accelerator ``a``, and the
    RNG states ``rng``; a model whose entry is None is left alone. ``source`` names the
    checkpoint in errors."""
    _check_counts(tree, a, source)
    for model, state in zip(a._models, tree["models"], strict=True):
        if state is not None:
            a.unwrap_model(model).load_state_dict(state, strict=strict)
    for opt, state in zip(a._optimizers, tree["optimizers"], strict=True):
        opt.load_state_dict(state)
    for sched, state in zip(a._schedulers, tree["schedulers"], strict=True):
        sched.load_state_dict(state)
    for dl, state in zip(a._dataloaders, tree["dataloaders"], strict=True):
        _load_dataloader_state(dl, state)
    if a.scaler is not None and tree.get("scaler") is not None:
        a.scaler.load_state_dict(tree["scaler"])
    for obj, state in zip(a._custom_objects, tree["custom"], strict=True):
        obj.load_state_dict(state)
    restore_rng(rng)
    a.step = int(tree["step"])


def state_tree(a: Any, models: list[Any], rng: Any) -> dict[str, Any]:
    """What ``save_state`` stores of accelerator ``a`` beside ``models`` (one entry per
    prepared model) and ``rng`` (:func:`capture_rng`)."""
    return {
        "models": models,
        "optimizers": [o.state_dict() for o in a._optimizers],
        "schedulers": [s.state_dict() for s in a._schedulers],
        "dataloaders": [_dataloader_state(d) for d in a._dataloaders],
        "scaler": a.scaler.state_dict() if a.scaler is not None else None,
        "custom": [o.state_dict() for o in a._custom_objects],
        "step": int(a.step),
        "rng": rng,
    }


def _check_counts(tree: dict[str, Any], a: Any, input_dir: str) -> None:
    """Clear errors when the accelerator's registrations do not match the checkpoint's."""
    for key, mine in (
        ("models", a._models),
        ("optimizers", a._optimizers),
        ("schedulers", a._schedulers),
        ("dataloaders", a._dataloaders),
        ("custom", a._custom_objects),
    ):
        if len(tree[key]) != len(mine):
            what = "register_for_checkpointing objects" if key == "custom" else f"prepared {key}"
            raise CheckpointError(
                f"accelerate: checkpoint {input_dir!r} holds {len(tree[key])} {key} but this "
                f"Accelerator has {len(mine)} {what}; load with the same set of objects"
            )


def _dataloader_state(dl: Any) -> dict[str, Any]:
    """What accelerate keeps of a dataloader: a seedable sampler's seed and epoch (it pickles
    the sampler object), a stateful dataloader's ``state_dict()``; and, which accelerate does
    not keep, the state of the generator it synchronizes across processes (with several
    processes a shuffling sampler draws from it: without it a resumed job shuffles the next
    epoch as the first one was, not as the uninterrupted job does)."""
    from accelerate.data_loader import SeedableRandomSampler

    out: dict[str, Any] = {}
    get_sampler = getattr(dl, "get_sampler", None)
    sampler = get_sampler() if get_sampler is not None else None
    if isinstance(sampler, SeedableRandomSampler):
        out["sampler"] = {"initial_seed": int(sampler.initial_seed), "epoch": int(sampler.epoch)}
    if getattr(dl, "use_stateful_dataloader", False):
        out["state"] = dl.state_dict()
    generator = getattr(dl, "synchronized_generator", None)
    if generator is not None:
        out["generator"] = generator.get_state()
    return out


def _load_dataloader_state(dl: Any, state: dict[str, Any]) -> None:
    if "sampler" in state:
        sampler = dl.get_sampler()
        sampler.initial_seed = state["sampler"]["initial_seed"]
        sampler.set_epoch(state["sampler"]["epoch"])
    if "state" in state and getattr(dl, "use_stateful_dataloader", False):
        dl.load_state_dict(state["state"])
    generator = getattr(dl, "synchronized_generator", None)
    if "generator" in state and generator is not None:
        generator.set_state(state["generator"])


def __getattr__(name: str) -> Any:
    if name != "ShardpointAccelerator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    base = _accelerate().Accelerator
    cls = type("ShardpointAccelerator", (ShardpointAcceleratorMixin, base), {})
    cls.__doc__ = "``accelerate.Accelerator`` saving and loading state through shardpoint."
    cls.__module__ = __name__
    globals()[name] = cls
    return cls
