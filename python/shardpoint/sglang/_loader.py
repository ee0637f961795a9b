"""The SGLang loader class (imports SGLang; see the package docstring).

It builds the model as SGLang's own ``DefaultModelLoader`` does (``_initialize_model`` under
the model's dtype, on the target device), feeds ``model.load_weights`` from
:func:`shardpoint.torch.weights_iterator` through SGLang's ``load_weights_and_postprocess``
(which also runs the quantization repacking), and returns the model in eval mode.
"""

from __future__ import annotations

import logging
import time

import torch
from sglang.srt.configs.device_config import DeviceConfig
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import loader as _sgl

from .. import storage
from ..convert.serving import resolve
from ..torch.weights import loader_options
from ..torch.weights_named import model_weights_iterator

__all__ = ["ShardpointModelLoader"]

logger = logging.getLogger("shardpoint.sglang")


class ShardpointModelLoader(_sgl.BaseModelLoader):
    """``sgl.Engine(model_path=DIR, load_format=ShardpointModelLoader)``: the whole model's
    checkpoint of a serving directory (or a checkpoint prefix / Hugging Face directory, or a
    ``ShardpointTrainer`` checkpoint with compressed weights), every tensor-parallel rank
    reading it and its layers keeping their part."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.options = loader_options(
            load_config.model_loader_extra_config, "model_loader_extra_config"
        )

    @staticmethod
    def _whole(model_config: ModelConfig) -> str:
        layout = resolve(model_config.model_path)
        if layout.whole is None:
            raise ValueError(f"{model_config.model_path}: no whole-model checkpoint in it")
        return layout.whole

    def download_model(self, model_config: ModelConfig) -> None:
        """Nothing is downloaded: check that the checkpoint is there and opens."""
        with storage.open(self._whole(model_config)):
            pass

    def load_model(
        self, *, model_config: ModelConfig, device_config: DeviceConfig
    ) -> torch.nn.Module:
        """Build the model, load every weight, post-process, return it in eval mode."""
        target = torch.device(device_config.device)
        quant_config = _sgl._get_quantization_config(model_config, self.load_config)
        with _sgl.set_default_torch_dtype(model_config.dtype):
            with target:
                model = _sgl._initialize_model(model_config, self.load_config, quant_config)
            start = time.perf_counter()
            # a trainer checkpoint's part hands out its model's names (without ``model/``)
            with model_weights_iterator(self._whole(model_config), **self.options) as it:
                _sgl.DefaultModelLoader.load_weights_and_postprocess(model, it, target)
            logger.info(
                "Loading weights took %.2f seconds (%.2f GB read)",
                time.perf_counter() - start,
                it.bytes_read / 1e9,
            )
        return model.eval()
