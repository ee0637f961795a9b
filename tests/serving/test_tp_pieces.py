"""Tensor parallelism without N-fold reads: ``shardpoint export --tp N`` writes one checkpoint
per rank, and each rank reads only its own bytes.

Emulated on CPU with a fake model whose ``load_weights`` cuts each whole weight as vLLM's
layers do (column-parallel on dim 0, row-parallel on dim 1, key/value heads shared by ranks
when there are fewer than ranks) unless the weight is flagged pre-cut (vLLM's
``is_sharded_weight``): ranks 0..N-1 reassembled equal the original, the pieces load exactly
what the whole checkpoint loads, and the bytes each rank reads (``/proc/self/io`` rchar: every
``read``/``pread`` of the process) are counted."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
hub = pytest.importorskip("huggingface_hub")

import shardpoint.torch as sptorch  # noqa: E402
from shardpoint.convert.serving import (  # noqa: E402
    TP_KEY,
    export_serving,
    rank_prefix,
    resolve,
    tp_plan,
)

HIDDEN, HEADS, KV, INTER, VOCAB, LAYERS = 256, 8, 2, 512, 64, 2
HEAD_DIM = HIDDEN // HEADS
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": HIDDEN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV,
    "intermediate_size": INTER,
    "vocab_size": VOCAB,
    "num_hidden_layers": LAYERS,
}


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "lm_head.weight": r(VOCAB, HIDDEN),
           "model.norm.weight": r(HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = r(HIDDEN, HIDDEN)
        out[p + "self_attn.q_proj.bias"] = r(HIDDEN)
        out[p + "self_attn.k_proj.weight"] = r(KV * HEAD_DIM, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = r(KV * HEAD_DIM, HIDDEN)
        out[p + "self_attn.o_proj.weight"] = r(HIDDEN, HIDDEN)
        out[p + "mlp.gate_proj.weight"] = r(INTER, HIDDEN)
        out[p + "mlp.up_proj.weight"] = r(INTER, HIDDEN)
        out[p + "mlp.down_proj.weight"] = r(HIDDEN, INTER)
        out[p + "mlp.down_proj.bias"] = r(HIDDEN)
        out[p + "input_layernorm.weight"] = r(HIDDEN)
    return out


def _cut(name: str, shape: tuple[int, ...]) -> tuple[int | None, int]:
    """How vLLM's layers cut a whole weight: (dim, number of distinct pieces)."""
    layer, kind = name.split(".")[-2:]
    if layer in ("q_proj", "gate_proj", "up_proj"):
        return 0, WORLD
    if layer in ("k_proj", "v_proj"):
        return 0, min(WORLD, KV)
    if layer in ("o_proj", "down_proj") and kind == "weight":
        return 1, WORLD
    return None, 1


WORLD = 4


class FakeTPModel:
    """Rank ``rank`` of ``world``: holds its part of every weight; ``load_weights`` cuts whole
    weights itself, and copies pre-cut ones (``presharded``) as they come, like vLLM's
    ``weight_loader`` with ``is_sharded_weight``."""

    def __init__(self, rank: int, presharded: bool) -> None:
        self.rank, self.presharded = rank, presharded
        self.params: dict[str, torch.Tensor] = {}
        for name, t in _state().items():
            dim, pieces = _cut(name, tuple(t.shape))
            shape = list(t.shape)
            if dim is not None:
                shape[dim] //= pieces
            self.params[name] = torch.full(shape, float("nan"), dtype=t.dtype)

    def load_weights(self, weights: object) -> set[str]:
        loaded = set()
        for name, w in weights:  # type: ignore[attr-defined]
            param = self.params[name]
            dim, pieces = _cut(name, tuple(w.shape))
            if dim is not None and not self.presharded:
                n = param.shape[dim]
                w = w.narrow(dim, (self.rank * pieces // WORLD) * n, n)
            assert w.shape == param.shape, name
            param.copy_(w)
            loaded.add(name)
        return loaded


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("tp")
    hf = d / "hf"
    hf.mkdir()
    hub.save_torch_state_dict(_state(), str(hf))
    (hf / "config.json").write_text(json.dumps(CONFIG))
    export_serving(str(hf), str(d / "whole"))
    export_serving(str(hf), str(d / "tp4"), tp=WORLD)
    return d


def _size(prefix: str) -> int:
    with sp.open(prefix) as r:
        return sum(n for _, n in r.format_info["shards"]) + os.path.getsize(prefix + ".index")


def test_ranks_reassemble_and_read_only_their_bytes(exported: pathlib.Path) -> None:
    whole = str(exported / "whole" / "model")
    total = _size(whole)
    # the process's first iterator pays one-time reads (lazy imports, libraries the first call
    # loads; 90-280 KB on this VM, depending on what earlier tests in the worker loaded):
    # paid here, so that each rank's count below is that rank's own reading
    warm = FakeTPModel(0, presharded=True)
    first = rank_prefix(str(exported / "tp4"), 0, WORLD)
    warm.load_weights(sptorch.weights_iterator(first, io="pread"))
    ranks = []
    for rank in range(WORLD):
        prefix = rank_prefix(str(exported / "tp4"), rank, WORLD)
        with sp.open(prefix) as r:
            assert r.metadata[TP_KEY]["rank"] == rank and r.metadata[TP_KEY]["world"] == WORLD
        model = FakeTPModel(rank, presharded=True)
        before = _rchar()
        assert model.load_weights(sptorch.weights_iterator(prefix, io="pread")) == set(_state())
        read = _rchar() - before
        assert read <= 0.3 * total, (rank, read, total)
        # each rank reading the whole checkpoint (vLLM's default) reads all of it, and keeps
        # exactly what the pieces gave
        full = FakeTPModel(rank, presharded=False)
        before = _rchar()
        full.load_weights(sptorch.weights_iterator(whole, io="pread"))
        assert _rchar() - before >= 0.95 * total
        for name in model.params:
            assert torch.equal(model.params[name], full.params[name]), (rank, name)
        ranks.append(model)
    for name, t in _state().items():
        dim, pieces = _cut(name, tuple(t.shape))
        if dim is None:
            assert all(torch.equal(m.params[name], t) for m in ranks), name
            continue
        distinct = [ranks[i * WORLD // pieces].params[name] for i in range(pieces)]
        assert torch.equal(torch.cat(distinct, dim=dim), t), name


def test_layout_and_kept_files(exported: pathlib.Path) -> None:
    layout = resolve(str(exported / "tp4"))
    assert layout.whole is None and layout.worlds == [WORLD]
    with pytest.raises(sp.NotFoundError, match="present: 4"):
        layout.rank(0, 2)
    cfg = json.loads((exported / "tp4" / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["num_key_value_heads"] == KV
    assert resolve(str(exported / "whole")).whole == str(exported / "whole" / "model")


def test_plan_refuses_what_it_cannot_cut() -> None:
    shapes = {k: tuple(v.shape) for k, v in _state().items()}
    with pytest.raises(sp.InvalidArgumentError, match="model_type 'gpt2'"):
        tp_plan({**CONFIG, "model_type": "gpt2"}, shapes, 2)
    with pytest.raises(sp.InvalidArgumentError, match="3 ranks"):
        tp_plan(CONFIG, shapes, 3)
    plan = tp_plan(CONFIG, shapes, 8)  # 2 key/value heads shared by 4 ranks each
    assert plan["model.layers.0.self_attn.k_proj.weight"] == (0, 2)
    assert plan["model.layers.0.self_attn.o_proj.weight"] == (1, 8)
    assert plan["model.layers.0.mlp.down_proj.bias"] == (None, 1)


def test_cli_export(exported: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "cli"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardpoint",
            "export",
            str(exported / "hf"),
            str(out),
            "--tp",
            "2",
            "--compression",
            "none",
        ],  # fmt: skip
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert resolve(str(out)).worlds == [2]
    with sp.open(rank_prefix(str(out), 1, 2)) as rd:
        assert rd.info("model.layers.0.mlp.down_proj.weight").shape == (HIDDEN, INTER // 2)
        assert rd.info("model.layers.0.self_attn.k_proj.weight").codec == "none"
    again = subprocess.run(
        [sys.executable, "-m", "shardpoint", "export", str(exported / "hf"), str(out)],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "exists" in again.stderr
