"""The vLLM loader classes (imports vLLM; see the package docstring).

Both feed ``model.load_weights`` with :func:`shardpoint.torch.weights_iterator` and then make
the check vLLM's default loader makes for unquantized models: every parameter was loaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import torch
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from .. import storage
from ..convert.serving import HF_PIECES, STATE_DICT, TP_KEY, WHOLE, Layout, rank_prefix, resolve
from ..errors import InvalidArgumentError
from ..storage import is_single_file
from ..torch.weights import loader_options, weights_iterator
from ..torch.weights_named import model_weights_iterator, trainer_model_keys

__all__ = ["ShardpointModelLoader", "ShardpointShardedLoader", "ShardpointAutoLoader"]

logger = logging.getLogger("shardpoint.vllm")


def _path(model_config: ModelConfig) -> str:
    """Where the weights are: ``model_weights`` when set (vLLM's override), else the model."""
    return str(getattr(model_config, "model_weights", None) or model_config.model)


def check_all_loaded(
    model: torch.nn.Module, loaded: Iterable[str] | None, model_config: ModelConfig
) -> None:
    """vLLM's rule: for an unquantized model whose ``load_weights`` reports what it loaded,
    every parameter must be among them (``ValueError`` naming the others)."""
    if loaded is None or getattr(model_config, "quantization", None) is not None:
        return
    missing = {n for n, _ in model.named_parameters()} - set(loaded)
    if missing:
        raise ValueError(
            f"Following weights were not initialized from checkpoint: {sorted(missing)}"
        )


class ShardpointModelLoader(BaseModelLoader):
    """``--load-format shardpoint``: the whole model's checkpoint of a serving directory (or
    any path ``weights_iterator`` reads: a checkpoint prefix, a Hugging Face directory), every
    rank reading all of it and its layers keeping their part (as vLLM's default loader)."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.options = loader_options(
            load_config.model_loader_extra_config, "model_loader_extra_config"
        )

    def _layout(self, model_config: ModelConfig) -> Layout:
        return resolve(_path(model_config))

    def download_model(self, model_config: ModelConfig) -> None:
        """Nothing is downloaded: check that the checkpoint is there and opens."""
        layout = self._layout(model_config)
        if layout.whole is None:
            raise ValueError(
                f"{_path(model_config)}: only tensor-parallel pieces here; use "
                "--load-format shardpoint_sharded"
            )
        with storage.open(layout.whole):
            pass

    def _weights(self, model_config: ModelConfig) -> Any:
        layout = self._layout(model_config)
        if layout.whole is None:
            raise ValueError(
                f"{_path(model_config)}: only tensor-parallel pieces here (model-rank-*); use "
                "--load-format shardpoint_sharded"
            )
        # a trainer checkpoint's part hands out its model's names (without ``model/``)
        return model_weights_iterator(layout.whole, **self.options)

    def load_weights(self, model: torch.nn.Module, model_config: ModelConfig) -> None:
        """Feed the model's own ``load_weights`` and check every parameter was loaded."""
        start = time.perf_counter()
        with self._weights(model_config) as it:
            loaded = model.load_weights(it)
        logger.info(
            "Loading weights took %.2f seconds (%.2f GB read, %.2f GB of tensors)",
            time.perf_counter() - start,
            it.bytes_read / 1e9,
            it.raw_bytes / 1e9,
        )
        check_all_loaded(model, loaded, model_config)


def _tp() -> tuple[int, int]:
    from vllm.distributed import (
        get_pp_group,
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    if get_pp_group().world_size > 1:
        raise ValueError("shardpoint_sharded: pipeline parallelism is not supported yet")
    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def _unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state_dict with each memory once (tied parameters share it): the first name
    of each (storage, offset, shape) group, as saved and loaded."""
    seen: set[tuple[Any, ...]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


class ShardpointShardedLoader(ShardpointModelLoader):
    """``--load-format shardpoint_sharded``: each tensor-parallel rank opens its own checkpoint
    (``model-rank-R-of-N``) and reads only its bytes. Two layouts: pieces of Hugging Face
    weights (``shardpoint export --tp N``; fed to ``model.load_weights`` with the linear layers'
    own cut switched off through vLLM's ``is_sharded_weight``), or a rank's parameters saved
    from a running engine (:meth:`save_model`; copied into ``model.state_dict()``)."""

    def download_model(self, model_config: ModelConfig) -> None:
        """Check that the pieces of this rank's world are there."""
        rank, world = _tp()
        with storage.open(self._layout(model_config).rank(rank, world)):
            pass

    def load_weights(self, model: torch.nn.Module, model_config: ModelConfig) -> None:
        rank, world = _tp()
        prefix = self._layout(model_config).rank(rank, world)
        with storage.open(prefix) as r:
            meta = r.metadata.get(TP_KEY)
        if not isinstance(meta, dict) or (meta.get("rank"), meta.get("world")) != (rank, world):
            raise ValueError(f"{prefix}: not rank {rank} of {world} (metadata {TP_KEY}: {meta!r})")
        start = time.perf_counter()
        if meta.get("layout") == STATE_DICT:
            self._copy_state(model, prefix)
        elif meta.get("layout") == HF_PIECES:
            self._load_pieces(model, model_config, prefix)
        else:
            raise ValueError(f"{prefix}: unknown layout {meta.get('layout')!r}")
        logger.info("Loading weights took %.2f seconds", time.perf_counter() - start)

    def _load_pieces(self, model: torch.nn.Module, model_config: ModelConfig, prefix: str) -> None:
        from vllm.model_executor.layers.linear import LinearBase

        marked = [
            p
            for m in model.modules()
            if isinstance(m, LinearBase)
            for p in m.parameters(recurse=False)
            if not getattr(p, "is_sharded_weight", False)
        ]
        for p in marked:
            p.is_sharded_weight = True  # vLLM's flag
        try:
            with weights_iterator(prefix, **self.options) as it:
                loaded = model.load_weights(it)
        finally:
            for p in marked:
                del p.is_sharded_weight
        check_all_loaded(model, loaded, model_config)

    def _copy_state(self, model: torch.nn.Module, prefix: str) -> None:
        state = _unique_state(model)
        with weights_iterator(prefix, **self.options) as it:
            for name, t in it:
                param = state.pop(name, None)
                if param is None:
                    raise ValueError(f"{prefix}: {name!r} is not a parameter of this model")
                if param.shape != t.shape:
                    raise ValueError(
                        f"{prefix}: {name!r} has shape {list(t.shape)}, the model's "
                        f"{list(param.shape)} (saved with another configuration?)"
                    )
                param.data.copy_(t)
        if state:
            raise ValueError(f"{prefix}: missing {sorted(state)}")

    @staticmethod
    def save_model(model: torch.nn.Module, path: str, *, compression: str | None = "zstd") -> str:
        """Save this rank's parameters (vLLM's names, already cut) as
        ``path/model-rank-R-of-N`` for ``--load-format shardpoint_sharded``; call it on every
        rank (vLLM's ``ShardedStateLoader.save_model`` convention). Returns the prefix."""
        rank, world = _tp()
        prefix = rank_prefix(path, rank, world)
        meta = {TP_KEY: {"world": world, "rank": rank, "layout": STATE_DICT}}
        from ..torch.tensors import tensor_to_numpy

        with storage.Writer(prefix, compression=compression, metadata=meta) as w:
            for name, t in _unique_state(model).items():
                w.add(name, tensor_to_numpy(t.detach().cpu()))
        return prefix


#: weight files vLLM's default loader reads itself: a directory holding any is left to it
_NATIVE = (".safetensors", ".bin", ".pt", ".pth")
#: a ``ShardpointTrainer`` checkpoint's part (its weights there with ``"compressed"``)
_TRAINER_PART = "shardpoint"


def is_serving_directory(path: str) -> bool:
    """Whether ``path`` is a local directory of shardpoint's whose weights vLLM's default
    loader cannot read: a serving directory (``shardpoint export``: ``model.index``) or a
    ``ShardpointTrainer`` checkpoint with its weights compressed in its part, and no weight
    file vLLM would read instead (a trainer checkpoint's ``optimizer.pt``, ``training_args.bin``
    ... are shardpoint single files, not weights)."""
    if not os.path.isdir(path):
        return False
    names = os.listdir(path)
    if any(n.endswith(_NATIVE) and not is_single_file(os.path.join(path, n)) for n in names):
        return False
    if os.path.isfile(os.path.join(path, WHOLE + ".index")):
        return True
    part = os.path.join(path, _TRAINER_PART)
    if not storage.exists(part):
        return False
    try:
        return trainer_model_keys(part)
    except InvalidArgumentError:  # another integration's: our loader's error says what it is
        return True


class ShardpointAutoLoader(DefaultModelLoader):
    """vLLM's default ``--load-format auto`` with one addition: a serving directory or a
    trainer checkpoint with compressed weights (which hold no weights vLLM reads itself, so
    vLLM would stop at "Cannot find any model weights") loads through
    :class:`ShardpointModelLoader`, so ``vllm serve ./llama-sp`` and ``vllm serve
    out/checkpoint-500`` work without the flag. Every other path is vLLM's default loader,
    unchanged."""

    def _ours(self, model_config: ModelConfig) -> ShardpointModelLoader | None:
        if not is_serving_directory(_path(model_config)):
            return None
        return ShardpointModelLoader(self.load_config)

    def download_model(self, model_config: ModelConfig) -> None:
        ours = self._ours(model_config)
        if ours is None:
            return super().download_model(model_config)
        return ours.download_model(model_config)

    def load_weights(self, model: torch.nn.Module, model_config: ModelConfig) -> None:
        ours = self._ours(model_config)
        if ours is None:
            return super().load_weights(model, model_config)
        logger.info("%s: a shardpoint serving directory, read by shardpoint", _path(model_config))
        return ours.load_weights(model, model_config)
