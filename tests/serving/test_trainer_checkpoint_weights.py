"""The serving routes' view of a ``ShardpointTrainer`` checkpoint whose weights are compressed
in its part (``shardpoint_weights="compressed"``: no ``model.safetensors``):
``model_weights_iterator`` hands out the model's own names (the part keeps them under
``model/``), the values the Trainer's own reader gives; another integration's part is refused
by name. vLLM's and SGLang's loaders use it (tests/serving/test_vllm_loader.py serves such a
checkpoint with ``vllm`` and the default load format). Real transformers, a tiny GPT-2, CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from integration_helpers import hf_run  # noqa: E402
from shardpoint.convert.serving import resolve  # noqa: E402
from shardpoint.errors import InvalidArgumentError  # noqa: E402
from shardpoint.integrations import hf_trainer  # noqa: E402
from shardpoint.integrations._state import save_tree  # noqa: E402
from shardpoint.torch.weights_named import model_weights_iterator  # noqa: E402


def test_a_compressed_trainer_checkpoint_hands_out_the_models_names(tmp_path: Path) -> None:
    hf_run.train("shardpoint-compressed", str(tmp_path), 3)
    ckpt = tmp_path / "checkpoint-3"
    assert not list(ckpt.glob("*.safetensors"))
    want = hf_trainer.load_checkpoint(ckpt)["model"]
    layout = resolve(ckpt)
    assert layout.whole == str(ckpt / "shardpoint")
    with model_weights_iterator(layout.whole) as it:
        got = {n: t.clone() for n, t in it}
        assert it.bytes_read > 0  # the iterator's own attributes, through the renaming
    model_names = set(hf_run.make_model().state_dict())
    assert set(got) == set(want) | {"lm_head.weight"} and set(got) <= model_names
    for name, t in want.items():
        assert torch.equal(got[name], t), name
    # the tied head is handed out too, as the embedding it shares memory with
    assert torch.equal(got["lm_head.weight"], got["transformer.wte.weight"])


def test_other_checkpoints_keep_their_names_and_another_trainers_part_is_refused(
    tmp_path: Path,
) -> None:
    import shardpoint as sp

    sp.save_file({"model/w": np.ones(3, np.float32)}, str(tmp_path / "plain"))
    with model_weights_iterator(str(tmp_path / "plain")) as it:
        assert [n for n, _ in it] == ["model/w"]  # not a trainer's: stored names
    part = str(tmp_path / "accel" / "shardpoint")
    save_tree({"models": [{"w": np.ones(3, np.float32)}]}, part, integration="accelerate")
    with pytest.raises(InvalidArgumentError, match=r"accelerate checkpoint, not a model"):
        model_weights_iterator(part)
