"""Serving directories: what ``vllm serve DIR --load-format shardpoint``, SGLang and
``shardpoint.hf.from_pretrained`` read, and ``shardpoint export`` writes.

A serving directory is a Hugging Face model directory whose weights are shardpoint checkpoints::

    DIR/config.json, tokenizer files, ...       as the source directory had them (config.json
                                                with ``dtype``: vLLM reads it, and without any
                                                *.safetensors it cannot guess it)
    DIR/model.index, DIR/model.data-*           the whole model (``--load-format shardpoint``)
    DIR/model-rank-R-of-N.index, .data-*        tensor-parallel pieces, one checkpoint per rank
                                                (``--load-format shardpoint_sharded``)

Tensor-parallel pieces (``export --tp N``): each rank's checkpoint holds, under the Hugging Face
names, exactly the part of each weight that rank's layers keep, cut the way vLLM's and SGLang's
layers cut a whole weight (column-parallel weights on dim 0, row-parallel on dim 1, key/value
heads shared by ``N / num_key_value_heads`` ranks when there are fewer heads than ranks);
everything else (embeddings, which the engines' vocabulary-parallel layers pad and cut
themselves, norms, row-parallel biases) is whole. So each rank reads and decodes only its own
bytes, instead of every rank reading the whole checkpoint. The cut is recorded per key in the
checkpoint's metadata (``shardpoint.tp``), so a loader can check it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import storage
from ..errors import InvalidArgumentError, NotFoundError
from ..storage.atomic_files import make_dirs
from ..storage.paths import SERVING_WHOLE, checkpoints_in
from ..storage.progress import progress_bar
from .base import ConvertResult
from .hf import is_hf_path
from .hf_files import SECTION, collect_files, with_dtype, write_files

__all__ = [
    "WHOLE",
    "TP_KEY",
    "Layout",
    "resolve",
    "rank_prefix",
    "config_dtype",
    "tp_plan",
    "export_serving",
]

#: The whole model's checkpoint prefix inside a serving directory.
WHOLE = SERVING_WHOLE
#: Metadata key of a rank checkpoint: ``{"world": N, "rank": R, "layout": ..., "splits": ...}``.
TP_KEY = "shardpoint.tp"
#: ``layout`` of pieces cut from Hugging Face weights (names kept; loaded through the model's
#: own ``load_weights`` with the engine's cut switched off).
HF_PIECES = "hf-pieces"
#: ``layout`` of a rank's own parameters saved from a running engine (the engine's names;
#: copied straight into its ``state_dict``).
STATE_DICT = "state-dict"


def rank_prefix(directory: str, rank: int, world: int) -> str:
    """The checkpoint prefix of tensor-parallel rank ``rank`` of ``world``."""
    return os.path.join(directory, f"{WHOLE}-rank-{rank}-of-{world}")


@dataclass
class Layout:
    """What a path given to a serving loader holds."""

    #: the directory holding config.json etc. on disk (``None``: only in the checkpoint)
    directory: str | None
    #: the whole model's checkpoint (a shardpoint prefix or a Hugging Face path), if any
    whole: str | None
    #: tensor-parallel worlds with a checkpoint per rank in ``directory``
    worlds: list[int] = field(default_factory=list)

    def rank(self, rank: int, world: int) -> str:
        """Rank ``rank``'s checkpoint prefix (``NotFoundError`` naming the worlds present)."""
        if self.directory is None or world not in self.worlds:
            have = ", ".join(map(str, self.worlds)) or "none"
            raise NotFoundError(
                f"{self.directory or self.whole}: no tensor-parallel checkpoints for {world} "
                f"ranks (present: {have}); write them with `shardpoint export SRC DIR --tp "
                f"{world}`"
            )
        return rank_prefix(self.directory, rank, world)


def _worlds(directory: str) -> list[int]:
    out = set()
    pattern = os.path.join(glob.escape(directory), f"{WHOLE}-rank-*-of-*.index")
    for p in glob.glob(pattern):
        tail = os.path.basename(p)[len(WHOLE) + len("-rank-") : -len(".index")]
        rank, _, world = tail.partition("-of-")
        if rank.isdigit() and world.isdigit():
            out.add(int(world))
    return sorted(out)


def resolve(path: str | os.PathLike[str]) -> Layout:
    """Where the weights and the config of ``path`` are: a serving directory, a directory
    holding one shardpoint checkpoint, a Hugging Face directory or file, or a checkpoint
    prefix (its config and tokenizer then come from the checkpoint's kept files)."""
    p = os.fspath(path)
    if storage.is_url(p):
        return Layout(None, p)
    # `P/` of a checkpoint saved with hashed_prefixes=True is a directory beside `P.index`
    # (FORMAT.md §3.1.1): the index says it is a prefix
    if os.path.isdir(p) and not os.path.isfile(p.rstrip("/") + ".index"):
        worlds = _worlds(p)
        found = checkpoints_in(p)  # DIR/model, else the one checkpoint in DIR
        if len(found) == 1:
            return Layout(p, found[0], worlds)
        if is_hf_path(p):
            return Layout(p, p, worlds)
        if worlds:
            return Layout(p, None, worlds)
        raise NotFoundError(f"{p}: no shardpoint checkpoint or safetensors weights in it")
    if storage.exists(p) or is_hf_path(p):
        return Layout(None, p)
    raise NotFoundError(f"{p}: no such checkpoint or directory")


def config_dtype(reader: Any) -> str | None:
    """The dtype transformers names in config.json for a checkpoint's weights: its floating
    dtype holding the most bytes (``None`` without floating tensors)."""
    sizes: dict[str, int] = {}
    for k in reader.keys():
        i = reader.info(k)
        if i.kind == "tensor" and i.dtype in ("bfloat16", "float16", "float32", "float64"):
            sizes[i.dtype] = sizes.get(i.dtype, 0) + i.raw_bytes
    return max(sizes, key=lambda d: sizes[d]) if sizes else None


def _kept(reader: Any) -> Mapping[str, Any] | None:
    if hasattr(reader, "index_path"):  # a Hugging Face directory read in place
        return collect_files(reader.directory, [])
    section = reader.sections.get(SECTION)
    return section if isinstance(section, Mapping) else None


def _config(section: Mapping[str, Any] | None) -> dict[str, Any]:
    for item in (section or {}).get("files", []):
        if isinstance(item, Mapping) and item.get("name") == "config.json":
            try:
                cfg = json.loads(item["data"])
            except (TypeError, ValueError):
                break
            if isinstance(cfg, dict):
                # multimodal configs keep the language model's numbers under text_config
                text = cfg.get("text_config")
                return {**cfg, **text} if isinstance(text, dict) else cfg
    return {}


# --- the tensor-parallel cut ------------------------------------------------------------------
#: Layers whose weight (and bias) the engines cut on dim 0 (column-parallel), by name suffix.
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
#: Layers whose weight the engines cut on dim 1 (row-parallel; the bias is whole).
_ROW = ("o_proj", "down_proj")
#: Architectures (``model_type``) whose layers are named as above, without fused projections.
TP_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "granite", "olmo2", "smollm3"}
)


def _split(key: str, ndim: int) -> tuple[str, int | None]:
    """``(layer kind, dim)`` of a weight: dim ``None`` for whole ones."""
    parts = key.split(".")
    if len(parts) >= 2 and parts[-1] in ("weight", "bias"):
        layer = parts[-2]
        if layer in _COLUMN:
            return layer, 0
        if layer in _ROW and parts[-1] == "weight" and ndim == 2:
            return layer, 1
    return "", None


def tp_plan(
    config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], world: int
) -> dict[str, tuple[int | None, int]]:
    """``key -> (dim, pieces)``: the dim each weight is cut on (``None``: whole) and into how
    many distinct pieces; rank ``r`` holds piece ``r * pieces // world`` (so ranks share a
    key/value head when there are fewer heads than ranks, as the engines replicate them)."""
    model_type = config.get("model_type")
    if model_type not in TP_MODEL_TYPES:
        raise InvalidArgumentError(
            f"no tensor-parallel cut is known for model_type {model_type!r} (known: "
            f"{', '.join(sorted(TP_MODEL_TYPES))}); save each rank's weights from a running "
            "engine instead (shardpoint.vllm.ShardpointShardedLoader.save_model)"
        )
    heads = int(config.get("num_attention_heads", 0))
    kv = int(config.get("num_key_value_heads") or heads)
    if heads % world:
        raise InvalidArgumentError(f"{heads} attention heads cannot be split over {world} ranks")
    if kv % world and world % kv:
        raise InvalidArgumentError(f"{kv} key/value heads cannot be shared by {world} ranks")
    plan: dict[str, tuple[int | None, int]] = {}
    for key, shape in shapes.items():
        layer, dim = _split(key, len(shape))
        if dim is None or dim >= len(shape):
            plan[key] = (None, 1)
            continue
        pieces = min(world, kv) if layer in ("k_proj", "v_proj") else world
        if shape[dim] % pieces:
            raise InvalidArgumentError(
                f"key {key!r}: dim {dim} of shape {list(shape)} cannot be cut into {pieces} pieces"
            )
        plan[key] = (dim, pieces)
    return plan


def _piece(value: np.ndarray, dim: int | None, pieces: int, rank: int, world: int) -> np.ndarray:
    if dim is None:
        return value
    n = value.shape[dim] // pieces
    i = rank * pieces // world
    return np.ascontiguousarray(np.take(value, range(i * n, (i + 1) * n), axis=dim))


# --- export -----------------------------------------------------------------------------------
def export_serving(
    src: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    tp: int | None = None,
    compression: str | None = "zstd",
    level: int | None = None,
    overwrite: bool = False,
    durable: bool = True,
    progress: bool | None = None,
) -> ConvertResult:
    """Write serving directory ``out_dir`` from ``src`` (a Hugging Face directory, a shardpoint
    checkpoint that kept one's files, or another serving directory): the kept files (config.json
    with ``dtype``, tokenizer...) and the whole model as ``out_dir/model``, or with ``tp=N`` one
    checkpoint per rank (see the module doc). Values stream one at a time; ``out_dir`` appears
    complete or not at all."""
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
        raise InvalidArgumentError(f"tp must be a positive number of ranks, got {tp!r}")
    layout = resolve(src)
    if layout.whole is None:
        raise NotFoundError(f"{src}: holds only tensor-parallel pieces, not a whole model")
    out = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out) and not overwrite)):
        raise InvalidArgumentError(f"destination {out} exists (pass overwrite / --force)")
    parent = os.path.dirname(out)
    make_dirs(parent)
    result = ConvertResult("shardpoint", "serving")
    with storage.open(layout.whole, io="pread") as reader:
        section = _kept(reader)
        if section is None and layout.directory is not None:
            section = collect_files(layout.directory, result.notes)
        section = with_dtype(section, config_dtype(reader))
        specs = [reader.info(k) for k in reader.keys()]
        tensors = [i for i in specs if i.kind == "tensor"]
        shapes = {i.key: tuple(i.shape) for i in tensors}
        plan = tp_plan(_config(section), shapes, tp) if tp else {}
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
        bar = progress_bar(
            sum(i.raw_bytes for i in specs), f"export {os.path.basename(out)}", progress=progress
        )
        try:
            worlds = [(r, tp) for r in range(tp)] if tp else [(0, 1)]
            writers = []
            for rank, world in worlds:
                meta = None
                if tp:
                    splits = {k: plan[k][0] for k in shapes}
                    meta = {
                        TP_KEY: {
                            "world": world,
                            "rank": rank,
                            "layout": HF_PIECES,
                            "splits": splits,
                        }
                    }
                prefix = rank_prefix(tmp, rank, world) if tp else os.path.join(tmp, WHOLE)
                writers.append(
                    storage.Writer(
                        prefix,
                        compression=compression,
                        level=level,
                        durable=durable,
                        metadata=meta,
                    )
                )
            try:
                for info in specs:
                    value = reader.get(info.key)
                    for (rank, world), w in zip(worlds, writers, strict=True):
                        if info.kind == "tensor" and tp:
                            dim, pieces = plan[info.key]
                            w.add(info.key, _piece(value, dim, pieces, rank, world))
                        else:
                            w.add(info.key, value)
                    result.entries += 1
                    result.raw_bytes += info.raw_bytes
                    bar.update(info.raw_bytes)
                    del value
                for w in writers:
                    w.commit()
            except BaseException:
                for w in writers:
                    w.abort()
                raise
            kept = write_files(
                section, tmp, taken=set(os.listdir(tmp)), where=str(src), durable=durable,
                notes=result.notes,
            )  # fmt: skip
            if not kept:
                result.notes.append(f"{src}: no config.json or tokenizer files were kept with it")
            _publish(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            bar.close()
    return result


def _publish(tmp: str, out: str, overwrite: bool) -> None:
    os.chmod(tmp, 0o755)
    if os.path.isdir(out) and overwrite and os.listdir(out):
        old = out + ".old-" + os.path.basename(tmp)
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    os.rename(tmp, out)  # atomic; also replaces an empty directory
