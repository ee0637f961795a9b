"""Which weights files a Hugging Face checkpoint holds, decided as transformers and PEFT decide.

``Trainer._save`` calls ``save_pretrained`` (a ``PreTrainedModel``, a PEFT ``PeftModel``) or
``safetensors.torch.save_file`` (any other module). :func:`plan_model` reproduces what those
write — the same file names, tensor names, shards and index — as :class:`WeightsGroup` lists
that :mod:`._weights_io` writes with shardpoint's writer:

- ``PreTrainedModel``: the state dict without ``_keys_to_ignore_on_save``, without tied
  duplicates (transformers' own ``remove_tied_weights_from_state_dict``), in the original
  checkpoint format (``revert_weight_conversion``), split into ``model.safetensors`` or
  ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json`` by
  ``huggingface_hub.split_torch_state_dict_into_shards`` at ``save_pretrained``'s default
  ``max_shard_size`` (50GB), ``{"format": "pt"}`` in every file;
- ``PeftModel``: for each adapter, PEFT's ``get_peft_model_state_dict`` in
  ``adapter_model.safetensors`` (the ``default`` adapter in the checkpoint directory, the others
  in a sub-directory of their name) next to ``adapter_config.json`` written by PEFT's config;
- any other module: its state dict in ``model.safetensors`` (one name per shared memory, as
  accelerate's ``clean_state_dict_for_safetensors`` keeps it).

Models whose saving transformers customises further (quantized, transformers-integrated
adapters, tensor-parallel or offloaded weights) and state dicts with values that are not plain
tensors return ``None``: their weights stay in the compressed shardpoint part, with a warning
saying why.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ._weights_io import WeightsGroup

__all__ = ["plan_model", "plan_state_dict", "DEFAULT_MAX_SHARD_SIZE"]

#: ``PreTrainedModel.save_pretrained``'s default
DEFAULT_MAX_SHARD_SIZE = "50GB"
_log = logging.getLogger(__name__)


def _peft_model_class() -> Any:
    try:
        from peft import PeftModel
    except ImportError:
        return None
    return PeftModel


def _pretrained_class() -> Any:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    return PreTrainedModel


def plan_state_dict(
    state_dict: dict[str, Any], file_name: str = "model.safetensors", where: str = ""
) -> WeightsGroup | None:
    """One file of a plain state dict (aliases dropped after the first name), or ``None``
    when a value is not a plain dense tensor."""
    import torch

    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    names: list[str] = []
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_meta:
            return None
        view = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if view in seen and t.numel() > 0:
            continue  # the same memory under another name: stored once, as safetensors must
        seen.add(view)
        names.append(name)
    return WeightsGroup(where, {file_name: names}, dict(state_dict))


def plan_model(
    model: Any, state_dict: dict[str, Any] | None = None, *, max_shard_size: int | str | None = None
) -> tuple[list[WeightsGroup] | None, str]:
    """The weights groups ``save_pretrained`` (or the Trainer, for other modules) would write
    for ``model``, or ``(None, why)`` when they stay in the shardpoint part."""
    peft_cls = _peft_model_class()
    if peft_cls is not None and isinstance(model, peft_cls):
        return _plan_peft(model, state_dict)
    pretrained = _pretrained_class()
    if pretrained is not None and isinstance(model, pretrained):
        return _plan_pretrained(model, state_dict, max_shard_size or DEFAULT_MAX_SHARD_SIZE)
    group = plan_state_dict(state_dict if state_dict is not None else model.state_dict())
    if group is None:
        return None, "its state dict holds values that are not dense tensors"
    return [group], ""


def _plan_pretrained(
    model: Any, state_dict: dict[str, Any] | None, max_shard_size: int | str
) -> tuple[list[WeightsGroup] | None, str]:
    if getattr(model, "hf_quantizer", None) is not None:
        return None, "the model is quantized (transformers serialises its quantization state)"
    if getattr(model, "_hf_peft_config_loaded", False):
        return None, "it has transformers-integrated adapters (PEFT through load_adapter)"
    if getattr(model, "_tp_size", None) or getattr(model.config, "distributed_config", None):
        return None, "it is sharded by tensor parallelism"
    device_map = getattr(model, "hf_device_map", None) or {}
    if "cpu" in device_map.values() or "disk" in device_map.values():
        return None, "some of its modules are offloaded"
    try:
        from huggingface_hub import split_torch_state_dict_into_shards
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError as e:  # another transformers version: say so, keep the checkpoint
        return None, f"this transformers version lacks a function save_pretrained uses ({e})"
    sd = dict(state_dict if state_dict is not None else model.state_dict())
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        sd.pop(key, None)
    sd = remove_tied_weights_from_state_dict(sd, model)
    sd = revert_weight_conversion(model, sd)
    base = plan_state_dict(sd)
    if base is None:
        return None, "its state dict holds values that are not dense tensors"
    split = split_torch_state_dict_into_shards(
        sd, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size
    )
    group = WeightsGroup("", dict(split.filename_to_tensors), sd)
    if split.is_sharded:
        group.index = "model.safetensors.index.json"
        group.index_metadata = {"total_parameters": model.num_parameters(), **split.metadata}
    return [group], ""


def _plan_peft(model: Any, state_dict: dict[str, Any] | None) -> tuple[list[WeightsGroup], str]:
    from peft.utils import get_peft_model_state_dict

    groups = []
    for name in model.peft_config:
        sd = get_peft_model_state_dict(
            model, state_dict=state_dict, adapter_name=name, save_embedding_layers="auto"
        )
        if plan_state_dict(sd) is None:  # PEFT's own state dicts hold tensors only
            raise TypeError(f"PEFT adapter {name!r}: its state dict holds non-tensor values")
        # every name, aliases too: PEFT clones aliased tensors rather than dropping names
        where = "" if name == "default" else name
        group = WeightsGroup(where, {"adapter_model.safetensors": list(sd)}, sd, kind="adapter")
        groups.append(group)
    return groups, ""


def write_peft_configs(model: Any, output_dir: str) -> None:
    """``adapter_config.json`` of every adapter, as ``PeftModel.save_pretrained`` writes it
    (``inference_mode`` true, the base model's name filled in, the auto-mapping of a config
    without a task type)."""
    for name, config in model.peft_config.items():
        where = output_dir if name == "default" else os.path.join(output_dir, name)
        os.makedirs(where, exist_ok=True)
        if config.base_model_name_or_path is None:
            base = model.base_model if config.is_prompt_learning else model.base_model.model
            config.base_model_name_or_path = base.__dict__.get("name_or_path", None) or None
        auto_mapping = None
        if config.task_type is None:
            cls = model._get_base_model_class(is_prompt_tuning=config.is_prompt_learning)
            auto_mapping = {"base_model_class": cls.__name__, "parent_library": cls.__module__}
        inference_mode, config.inference_mode = config.inference_mode, True
        try:
            config.save_pretrained(where, auto_mapping_dict=auto_mapping)
        finally:
            config.inference_mode = inference_mode


def write_compressed_adapters(model: Any, output_dir: str) -> None:
    """With the weights in the compressed part, each PEFT adapter also as
    ``adapter_model.bin`` (beside its ``adapter_config.json``), a shardpoint single file: PEFT's
    ``PeftModel.from_pretrained(checkpoint)`` and a plain ``Trainer``'s resume
    (``load_adapter``) read that name with ``torch.load``, whose front reads ours. Without
    it the next script found no ``adapter_config.json``. Adapters are small: the copy costs
    little beside the part."""
    from ..torch import save as sp_save

    for group in _plan_peft(model, None)[0]:
        path = os.path.join(group.directory(output_dir), "adapter_model.bin")
        sp_save(dict(group.tensors), path, single_file=True)


def warn_kept(what: str, why: str) -> None:
    """Say once per call site that a model's weights stay in the compressed part."""
    _log.warning(
        "shardpoint: %s: the model weights are kept in the compressed shardpoint part, not as "
        "safetensors files, because %s",
        what,
        why,
    )


def save_model_files(
    model: Any,
    output_dir: str,
    collect: dict[str, Any],
    mode: str,
    max_shard_size: int | str | None = None,
) -> None:
    """What ``save_pretrained`` writes into ``output_dir`` besides the weights (the config and
    generation config; PEFT's adapter configs), and the weights into ``collect``: their
    groups under ``"__weights__"`` (``mode="safetensors"``) or the state dict under
    ``"model"`` (``mode="compressed"``, or a model :func:`plan_model` cannot plan)."""
    peft_cls = _peft_model_class()
    is_peft = peft_cls is not None and isinstance(model, peft_cls)
    groups = None
    if mode == "safetensors":
        groups, why = plan_model(model, max_shard_size=max_shard_size)
        if groups is None:
            warn_kept(type(model).__name__, why)
    if groups is not None:
        collect["__weights__"] = groups
    else:
        collect["model"] = model.state_dict()
    if is_peft:
        write_peft_configs(model, output_dir)
        if groups is None:
            write_compressed_adapters(model, output_dir)
    elif getattr(model, "config", None) is not None and hasattr(model, "save_pretrained"):
        # as save_pretrained does: the class that loads these weights, their dtype
        model.config.architectures = [type(model).__name__]
        dtype = getattr(model, "dtype", None)
        if dtype is not None and not is_peft:
            model.config.dtype = str(dtype).split(".")[1]
        model.config.save_pretrained(output_dir)
        gen = getattr(model, "generation_config", None)
        if gen is not None and getattr(model, "can_generate", lambda: False)():
            gen.save_pretrained(output_dir)
