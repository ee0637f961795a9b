"""Hugging Face ``Trainer``: use :class:`ShardpointTrainer` where you used ``Trainer``.

``ShardpointTrainer`` is ``Trainer`` with :class:`ShardpointTrainerMixin` in front; for your
own ``Trainer`` subclass (or a library's, e.g. TRL's) use ``with_shardpoint(MyTrainer)``.

Each ``checkpoint-N`` directory the Trainer writes is a Hugging Face model directory, as
with ``Trainer``: ``config.json`` (and the tokenizer / processor files, the generation config),
the weights as ``save_pretrained`` names them (``model.safetensors``, or its shards and
``model.safetensors.index.json``; a PEFT model's ``adapter_model.safetensors`` and
``adapter_config.json``), written by shardpoint (:mod:`._weights_io`), and
``trainer_state.json``. The training state is in files under ``Trainer``'s own names,
``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth`` and ``training_args.bin``,
each a shardpoint single file (compressed, crc-checked, no pickle; ``torch.load`` reads them
through the front shardpoint installs, so ``Trainer``'s own resume does too: :mod:`._hf_files`),
plus ``training_args.json``. One shardpoint checkpoint ``shardpoint.index`` +
``shardpoint.data-*``, written last, records the crc32c of every weight tensor; its commit marks
the checkpoint complete. Resuming and loading the best model check each weight tensor against
its crc32c. ``shardpoint_weights="compressed"`` keeps the weights in the shardpoint part instead
(``model/...``; smaller, but no longer a model directory).
``resume_from_checkpoint=True``/a path, ``save_total_limit`` and ``load_best_model_at_end`` work
as with ``Trainer`` (its own logic decides when to save, rotate and which checkpoint is best).

Why a mixin over the Trainer's save/load methods rather than a ``TrainerCallback``: callbacks
only see a checkpoint after ``Trainer`` has written it (pickles included) and cannot take over
loading, so a callback can at best convert and delete afterwards. The mixin overrides the
leaf methods that write and read each part (``_save_checkpoint``'s parts, ``_load_*``), whose
names and arguments have been stable across transformers 4.x and 5.x, and keeps everything
that decides *when* (save steps, best-metric tracking, rotation, batch skipping on resume)
in ``Trainer``. If a future version renames one of them, constructing the trainer raises an
error naming it, instead of silently saving pickles. DeepSpeed, FSDP, XLA and SageMaker-MP
runs, whose checkpoints those frameworks write themselves, fall back to ``Trainer``'s code.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, InvalidArgumentError
from ._hf_files import FILES, native_rng, read_files, rng_file, save_args
from ._hf_resume import read_part
from ._hf_tiers import HFTiers, saving_callback
from ._hf_weights import save_model_files
from ._state import (
    PendingSaves,
    load_tree,
    module_targets,
    part_prefix,
    restore_rng,
    save_tree,
)
from ._weights_io import load_group, read_manifest, save_with_weights, verify_weights

__all__ = [
    "ShardpointTrainer",
    "ShardpointTrainerMixin",
    "with_shardpoint",
    "from_pretrained",
    "export_pretrained",
    "load_checkpoint",
    "last_complete_checkpoint",
]

if TYPE_CHECKING:
    ShardpointTrainer: type  # built on first use (module __getattr__): it subclasses Trainer

_PART = "shardpoint"
_NAME = "hf_trainer"
_ARGS_FILE = "training_args.json"
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")

#: the Trainer methods the mixin overrides: each must exist on the Trainer it extends
HOOKED = (
    "_save_checkpoint",
    "save_model",
    "_save_optimizer_and_scheduler",
    "_save_scaler",
    "_save_rng_state",
    "_load_from_checkpoint",
    "_load_optimizer_and_scheduler",
    "_load_scaler",
    "_load_rng_state",
    "_load_best_model",
    "train",
)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "shardpoint.integrations.hf_trainer needs transformers: "
            "pip install 'shardpoint[transformers]'"
        ) from exc
    return transformers


def load_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The saved parts of a checkpoint directory: ``{"model", "optimizer", "scheduler",
    "scaler", "rng"}`` (those that were saved), tensors on the CPU; ``model`` is the state
    dict of the weights files (checked against their crc32c) or of the part."""
    root = os.fspath(checkpoint_dir)
    tree = dict(load_tree(part_prefix(root, _PART), integration=_NAME))
    # rank 0's generators when each process saved its own (rng_state_<i>.pth)
    tree.update(read_files(root, integration=_NAME, rng="rng_state_0.pth"))
    manifest = read_manifest(part_prefix(root, _PART), _NAME)
    if manifest is not None:
        model: dict[str, Any] = {}
        for group in manifest["groups"]:
            model.update(load_group(root, group))
        tree["model"] = model
    return tree


def last_complete_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The ``checkpoint-N`` directory with the highest N whose shardpoint part was committed
    (``get_last_checkpoint`` without the directories a killed save left incomplete)."""
    from .. import storage

    if not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        m = _CHECKPOINT_DIR.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isdir(path) and storage.exists(part_prefix(path, _PART)):
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def _model_state(checkpoint_dir: str | os.PathLike[str], model: Any = None) -> dict[str, Any]:
    """The model weights of a checkpoint (its weights files, each tensor checked, or its
    part); with ``model`` (the module it restores) read into the module's parameters where
    they are plain CPU tensors."""
    root = os.fspath(checkpoint_dir)
    manifest = read_manifest(part_prefix(root, _PART), _NAME)
    if manifest is not None:
        targets = module_targets(model) if model is not None else None
        state: dict[str, Any] = {}
        for group in manifest["groups"]:
            state.update(load_group(root, group, targets))
        return state
    tree = load_tree(
        part_prefix(checkpoint_dir, _PART),
        integration=_NAME,
        into={"model": module_targets(model)} if model is not None else None,
    )
    if "model" not in tree:
        raise CheckpointError(f"hf_trainer: checkpoint {os.fspath(checkpoint_dir)!r} has no model")
    return dict(tree["model"])


#: ``from_pretrained``'s own keywords (transformers 5), some of which are also config
#: attributes (``dtype``): never taken as config overrides
_LOADING_KEYWORDS = frozenset(
    {
        "dtype", "torch_dtype", "attn_implementation", "experts_implementation", "device_map",
        "max_memory", "offload_folder", "offload_buffers", "quantization_config",
        "output_loading_info", "state_dict", "generation_config", "trust_remote_code",
        "tp_plan", "tp_size", "device_mesh", "key_mapping", "adapter_name", "adapter_kwargs",
        "variant", "gguf_file", "use_kernels", "kernel_config", "cache_dir",
        "ignore_mismatched_sizes", "force_download", "local_files_only", "token", "revision",
        "use_safetensors", "weights_only", "fusion_config", "disable_mmap", "low_cpu_mem_usage",
        "subfolder", "proxies",
    }
)  # fmt: skip


def from_pretrained(model_cls: Any, checkpoint_dir: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``model_cls.from_pretrained`` for a checkpoint directory written by
    :class:`ShardpointTrainer`, its weights checked against their crc32c first (with the
    weights in safetensors form ``model_cls.from_pretrained(checkpoint_dir)`` works as well,
    unchecked). ``model_cls`` is a model class or an ``AutoModel...`` class; ``kwargs`` go to
    ``from_pretrained`` (``torch_dtype``, ``device_map``...)."""
    transformers = _transformers()
    root = os.fspath(checkpoint_dir)
    manifest = read_manifest(part_prefix(root, _PART), _NAME)
    if manifest is not None:
        verify_weights(root, manifest)
        return model_cls.from_pretrained(root, **kwargs)
    config = kwargs.pop("config", None)
    if config is None:
        config = transformers.AutoConfig.from_pretrained(os.fspath(checkpoint_dir))
        # as from_pretrained does without a config: keywords naming config attributes
        # (num_labels=3, output_hidden_states=True) set them; the model __init__ would refuse
        for k in [k for k in kwargs if k not in _LOADING_KEYWORDS and hasattr(config, k)]:
            setattr(config, k, kwargs.pop(k))
    state = _model_state(checkpoint_dir)
    if hasattr(model_cls, "_model_mapping"):  # an AutoModel... class: its concrete class
        model_cls = _concrete_class(model_cls, config)
    # transformers' own loading from the state dict: dtype="auto", device_map,
    # output_loading_info, a base model from a checkpoint with a head... as for its files
    return model_cls.from_pretrained(None, config=config, state_dict=state, **kwargs)


def _concrete_class(auto_cls: Any, config: Any) -> Any:
    """The model class ``auto_cls.from_pretrained`` builds for ``config`` (the auto mapping,
    as transformers looks it up)."""
    try:
        from transformers.models.auto.auto_factory import _get_model_class
    except ImportError:  # a transformers without the helper: the mapping itself
        found = auto_cls._model_mapping[type(config)]
        return found[0] if isinstance(found, list | tuple) else found
    return _get_model_class(config, auto_cls._model_mapping)


def export_pretrained(
    checkpoint_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], **kwargs: Any
) -> None:
    """Write a plain Hugging Face model directory (``config.json`` + ``model.safetensors``,
    sharded as ``save_pretrained`` shards) from a checkpoint directory; ``kwargs`` go to
    ``save_pretrained`` (``max_shard_size``...)."""
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(os.fspath(checkpoint_dir))
    model_cls = transformers.AutoModel
    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch and hasattr(transformers, arch):
        model_cls = getattr(transformers, arch)
    model = from_pretrained(model_cls, checkpoint_dir, config=config)
    model.save_pretrained(os.fspath(out_dir), **kwargs)


class ShardpointTrainerMixin:
    """Put in front of ``Trainer`` (or a subclass): checkpoints through shardpoint.

    Extra keyword arguments of the trainer's constructor: ``shardpoint_blocking`` (default
    True; ``False`` returns from a save once the state is snapshotted and writes it in the
    background: resuming, loading the best model, the next save and the end of ``train``
    wait for it), ``shardpoint_compression`` (``"zstd"``) and ``shardpoint_level``, and
    ``shardpoint_weights``: ``"safetensors"`` (default: the model directory the Trainer
    writes, each tensor's crc32c recorded) or ``"compressed"`` (the weights in the shardpoint
    part, compressed: smaller checkpoints that only shardpoint reads), and
    ``shardpoint_max_shard_size`` (``save_pretrained``'s ``max_shard_size``, default
    ``"50GB"``: larger weights are split into ``model-0000k-of-0000n.safetensors`` files and
    ``model.safetensors.index.json``, as ``save_pretrained`` splits them).

    ``shardpoint_local_directory`` (a node-local directory: tmpfs or NVMe) turns the multi-tier
    checkpoints on (docs/TIERS.md): every ``local_every`` (10) optimizer steps each rank's
    training state goes there and to a peer node, every ``persistent_every`` (1000) steps
    also to the persistent tier (``directory``, default ``<output_dir>/tiers``), in the
    background; ``train(resume_from_checkpoint=True)`` resumes from the newest step complete
    in any tier, or from the newest ``checkpoint-N`` when that is newer. ``shardpoint_tiers``:
    a dict of ``TieredCheckpointManager`` arguments (``directory``, ``local_every``,
    ``persistent_every``, ``replicas``, ``replication_jump``, ``max_to_keep``,
    ``local_max_to_keep``, ``timeout``). ``self.shardpoint_tiers`` (``restored_step``,
    ``restore_plan``) says what the last ``train`` resumed from.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sp_weights = kwargs.pop("shardpoint_weights", "safetensors")
        if self._sp_weights not in ("safetensors", "compressed"):
            raise InvalidArgumentError(
                f"shardpoint_weights must be 'safetensors' or 'compressed', got {self._sp_weights!r}"
            )
        self._sp_max_shard_size = kwargs.pop("shardpoint_max_shard_size", None)
        self._sp_blocking = bool(kwargs.pop("shardpoint_blocking", True))
        self._sp_compression = kwargs.pop("shardpoint_compression", "zstd")
        self._sp_level = kwargs.pop("shardpoint_level", None)
        self._sp_pending = PendingSaves()
        self._sp_collect: dict[str, Any] | None = None
        self._sp_loaded: dict[str, dict[str, Any]] = {}
        local = kwargs.pop("shardpoint_local_directory", None)
        tier_opts = kwargs.pop("shardpoint_tiers", None)
        if tier_opts is not None and local is None:
            raise InvalidArgumentError("shardpoint_tiers needs shardpoint_local_directory")
        base = type(self).__mro__
        for name in HOOKED:
            if not any(name in vars(c) for c in base if c is not ShardpointTrainerMixin):
                raise CheckpointError(
                    f"ShardpointTrainer: this transformers version's Trainer has no {name}(); "
                    "shardpoint's Hugging Face integration does not support it yet"
                )
        super().__init__(*args, **kwargs)
        self.shardpoint_tiers: HFTiers | None = None
        if local is not None:
            self.shardpoint_tiers = HFTiers(self, local, tier_opts)
            t: Any = self
            t.add_callback(saving_callback(self.shardpoint_tiers))

    # -- which runs we handle: the ones whose checkpoint Trainer writes with torch.save -------

    def _sp_native(self) -> bool:
        from transformers.utils import is_sagemaker_mp_enabled, is_torch_xla_available

        t: Any = self
        return bool(
            t.is_deepspeed_enabled
            or t.is_fsdp_enabled
            or is_torch_xla_available()
            or is_sagemaker_mp_enabled()
        )

    # -- save: the parts are collected, then written as one checkpoint --------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        if self._sp_native():
            return super()._save_checkpoint(model, trial)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        # rotation (inside Trainer's _save_checkpoint) must not delete a checkpoint that is
        # still being written in the background
        self._sp_pending.wait()
        self._sp_collect = {}
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
            parts, self._sp_collect = self._sp_collect, None
        finally:
            self._sp_collect = None
        t: Any = self
        if not parts or not t.args.should_save:
            return
        output_dir = parts.pop("__dir__")
        groups = parts.pop("__weights__", None)
        options: dict[str, Any] = {
            "blocking": self._sp_blocking,
            "compression": self._sp_compression,
            "level": self._sp_level,
        }
        # the training state first, in the files Trainer names; the part last: its commit marks
        # the checkpoint complete (the saver commits in call order)
        for name, file in FILES.items():
            if name in parts:
                path = os.path.join(output_dir, file)
                fut = save_tree(
                    parts.pop(name), path, **options, integration=_NAME, single_file=True
                )
                if fut is not None:
                    self._sp_pending.add(path, fut)
        rng = parts.pop("rng", None)
        if rng is not None:
            path = os.path.join(output_dir, rng_file(t.args.world_size, t.args.process_index))
            fut = save_tree(rng, path, **options, integration=_NAME, single_file=True)
            if fut is not None:
                self._sp_pending.add(path, fut)
        prefix = part_prefix(output_dir, _PART)
        if groups is not None:
            fut = save_with_weights(output_dir, prefix, parts, groups, **options, integration=_NAME)
        else:
            fut = save_tree(parts, prefix, **options, integration=_NAME)
        if fut is not None:
            self._sp_pending.add(output_dir, fut)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if self._sp_collect is None or not _internal_call:
            # a user's save_model(): a plain Hugging Face directory, as Trainer writes it
            return super().save_model(output_dir, _internal_call)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        t: Any = self
        output_dir = output_dir if output_dir is not None else t.args.output_dir
        assert output_dir is not None
        self._sp_collect["__dir__"] = output_dir
        if not t.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        model = t.accelerator.unwrap_model(t.model, keep_torch_compile=False)
        save_model_files(
            model, output_dir, self._sp_collect, self._sp_weights, self._sp_max_shard_size
        )
        if getattr(t, "processing_class", None) is not None:
            t.processing_class.save_pretrained(output_dir)
        elif getattr(getattr(t, "data_collator", None), "tokenizer", None) is not None:
            t.data_collator.tokenizer.save_pretrained(output_dir)  # as Trainer._save does
        with open(os.path.join(output_dir, _ARGS_FILE), "w", encoding="utf-8") as f:
            f.write(t.args.to_json_string())
        save_args(t.args, output_dir, integration=_NAME)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self._sp_collect is None:
            return super()._save_optimizer_and_scheduler(output_dir)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        t: Any = self
        if t.optimizer is not None:
            self._sp_collect["optimizer"] = t.optimizer.state_dict()
        if t.lr_scheduler is not None:
            self._sp_collect["scheduler"] = t.lr_scheduler.state_dict()

    def _save_scaler(self, output_dir: str) -> None:
        if self._sp_collect is None:
            return super()._save_scaler(output_dir)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        scaler = getattr(getattr(self, "accelerator", None), "scaler", None)
        if scaler is not None:
            self._sp_collect["scaler"] = scaler.state_dict()

    def _save_rng_state(self, output_dir: str) -> None:
        if self._sp_collect is None:
            return super()._save_rng_state(output_dir)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        t: Any = self
        rng = native_rng(getattr(t.args.parallel_mode, "value", None) == "distributed")
        if t.args.world_size > 1 and not t.args.should_save:
            # every process keeps its own generators, as Trainer saves them (rng_state_<i>.pth)
            path = os.path.join(output_dir, rng_file(t.args.world_size, t.args.process_index))
            save_tree(rng, path, integration=_NAME, compression=None, single_file=True)
            return
        self._sp_collect["rng"] = rng

    # -- load ---------------------------------------------------------------------------------

    def _sp_has(self, checkpoint: str | None) -> bool:
        from .. import storage

        # ours: our index, or our training_args.json (an index missing beside it is then
        # reported as such, not as a missing model.safetensors)
        return (
            checkpoint is not None
            and not self._sp_native()
            and (
                storage.exists(part_prefix(checkpoint, _PART))
                or os.path.exists(os.path.join(checkpoint, _ARGS_FILE))
            )
        )

    def _sp_part(self, checkpoint: str, name: str, model: Any = None) -> Any:
        """Part ``name`` of the checkpoint, all parts read once (cached). ``model``: the module
        the model part restores; its parameters (and the optimizer's existing state tensors)
        receive their stored values in place as the checkpoint is read."""
        self._sp_pending.wait()
        key = os.path.abspath(checkpoint)
        if key not in self._sp_loaded:
            self._sp_loaded = {key: read_part(self, checkpoint, model)}  # one checkpoint cached
        return self._sp_loaded[key].get(name)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kw: Any) -> Any:
        t: Any = self
        tiers = self.shardpoint_tiers
        try:
            if tiers is not None:
                if self._sp_native():
                    raise InvalidArgumentError(
                        "shardpoint_local_directory: the tiers save each rank's whole state, "
                        "which DeepSpeed, FSDP, XLA and SageMaker-MP runs partition themselves; "
                        "not supported with them yet"
                    )
                tiers.open()  # a collective: every rank's train() gets here
                if resume_from_checkpoint is True:
                    resume_from_checkpoint = self._sp_newest(tiers)
            if resume_from_checkpoint is True and not self._sp_native():
                resume_from_checkpoint = last_complete_checkpoint(t.args.output_dir)
                if resume_from_checkpoint is None:
                    raise ValueError(
                        f"No valid checkpoint found in output directory ({t.args.output_dir}): "
                        "no checkpoint-N directory there holds a committed shardpoint checkpoint"
                    )
            return super().train(resume_from_checkpoint, *args, **kw)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        finally:
            self._sp_loaded = {}
            try:
                self._sp_pending.wait()
            finally:
                if tiers is not None:
                    tiers.close()

    def _sp_newest(self, tiers: HFTiers) -> str:
        """Where ``resume_from_checkpoint=True`` resumes with the tiers on: their newest
        complete step (restored into memory, a collective), or the newest committed
        ``checkpoint-N`` of ``output_dir`` when its step is higher."""
        t: Any = self
        tiers.restored_step = None
        step = tiers.restore()
        found = last_complete_checkpoint(t.args.output_dir)
        found_step = int(os.path.basename(found).split("-")[-1]) if found else None
        if step is not None and (found_step is None or step >= found_step):
            return tiers.use_restored()
        tiers.drop_restored()
        if found is None:
            raise ValueError(
                f"No valid checkpoint found: no tier under {tiers.local_directory!r} holds a "
                f"complete step and no checkpoint-N in {t.args.output_dir} is committed"
            )
        return found

    def _sp_manifest(self, checkpoint: str) -> dict[str, Any] | None:
        self._sp_pending.wait()
        return read_manifest(part_prefix(checkpoint, _PART), _NAME)

    def _sp_load_weights(self, checkpoint: str, manifest: dict[str, Any], model: Any) -> bool:
        """Load the weights files of ``checkpoint`` into ``model``, each tensor checked against
        its crc32c, as ``Trainer`` loads them (non-strict, its warnings). Returns ``False`` for
        PEFT adapters, checked only: PEFT's own loader (the Trainer's code) then loads them."""
        if any(g["kind"] != "model" for g in manifest["groups"]):
            verify_weights(checkpoint, manifest)
            return False
        targets = module_targets(model)
        state: dict[str, Any] = {}
        for group in manifest["groups"]:
            state.update(load_group(checkpoint, group, targets))
        t: Any = self
        # Trainer loads non-strictly (tied weights are not in the files) and warns itself
        t._issue_warnings_after_load(model.load_state_dict(state, False))
        return True

    def _sp_tier(self, checkpoint: str | None) -> HFTiers | None:
        """The tiers, when ``checkpoint`` is the directory of their restored step."""
        tiers = self.shardpoint_tiers
        return tiers if tiers is not None and tiers.is_resume_dir(checkpoint) else None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        tiers = self._sp_tier(resume_from_checkpoint)
        if tiers is not None:
            t0: Any = self
            return tiers.load_model(model if model is not None else t0.model)
        if not self._sp_has(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        t: Any = self
        target = model if model is not None else t.model
        manifest = self._sp_manifest(resume_from_checkpoint)
        if manifest is not None:
            if not self._sp_load_weights(resume_from_checkpoint, manifest, target):
                super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
            return
        state = self._sp_part(resume_from_checkpoint, "model", target)
        if state is None:
            raise CheckpointError(f"hf_trainer: {resume_from_checkpoint!r} holds no model")
        target.load_state_dict(state, strict=True)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        tiers = self._sp_tier(checkpoint)
        if tiers is not None:
            return tiers.load_optimizer_and_scheduler()
        if not self._sp_has(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        assert checkpoint is not None
        t: Any = self
        opt = self._sp_part(checkpoint, "optimizer")
        if opt is not None:
            t.optimizer.load_state_dict(opt)
        sched = self._sp_part(checkpoint, "scheduler")
        if sched is not None:
            t.lr_scheduler.load_state_dict(sched)

    def _load_scaler(self, checkpoint: str | None) -> None:
        tiers = self._sp_tier(checkpoint)
        if tiers is not None:
            return tiers.load_scaler()
        if not self._sp_has(checkpoint):
            return super()._load_scaler(checkpoint)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        assert checkpoint is not None
        state = self._sp_part(checkpoint, "scaler")
        scaler = getattr(getattr(self, "accelerator", None), "scaler", None)
        if state is not None and scaler is not None:
            scaler.load_state_dict(state)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        tiers = self._sp_tier(checkpoint)
        if tiers is not None:
            return tiers.load_rng()
        if not self._sp_has(checkpoint):
            return super()._load_rng_state(checkpoint)  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        assert checkpoint is not None
        state = self._sp_part(checkpoint, "rng")
        if state is not None:
            restore_rng(state)

    def _load_best_model(self) -> None:
        t: Any = self
        best = t.state.best_model_checkpoint
        if not self._sp_has(best):
            return super()._load_best_model()  # type: ignore[misc]  # a mixin: the base comes after it in the MRO
        manifest = self._sp_manifest(best)
        if manifest is None:
            t.model.load_state_dict(_model_state(best, t.model), strict=True)
        elif not self._sp_load_weights(best, manifest, t.model):
            super()._load_best_model()  # type: ignore[misc]  # a mixin: the base comes after it in the MRO


def with_shardpoint(trainer_cls: type) -> type:
    """``trainer_cls`` (``Trainer`` or a subclass) saving and resuming through shardpoint."""
    return type(
        trainer_cls.__name__.join(["Shardpoint", ""]), (ShardpointTrainerMixin, trainer_cls), {}
    )


def __getattr__(name: str) -> Any:
    if name != "ShardpointTrainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = with_shardpoint(_transformers().Trainer)
    cls.__doc__ = "``transformers.Trainer`` saving and resuming through shardpoint (module doc)."
    cls.__module__ = __name__
    globals()[name] = cls
    return cls
