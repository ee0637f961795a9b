"""What ``shardpoint.convert`` exports: telling formats apart (:func:`detect_format`), opening
any source (:func:`open_source`), resolving what a user typed (:func:`resolve_prefix`) and
:func:`convert` itself. Its own module so that ``import shardpoint.convert.hf`` (every reader of
a Hugging Face directory) does not import every other format's code: the package's
``__init__`` loads this module on the first name asked of it (that import cost 20 ms of a
100 ms warm 1 GB ``load_into``: docs/SERVING.md)."""

from __future__ import annotations

import os
from collections.abc import Callable

from .. import storage
from ..errors import CorruptCheckpointError, InvalidArgumentError, NotFoundError
from ..objgraph.checkpoint_state import latest_checkpoint
from ..storage.atomic_files import make_dirs
from ..storage.paths import checkpoints_in, lost_index
from .base import ConvertResult, Source, Spec
from .hf import HFSource, is_hf_path
from .hf_export import export_hf, write_hf
from .safetensors_io import SafetensorsSource, is_safetensors, write_safetensors
from .shardpoint_io import ShardpointSource, write_shardpoint
from .tensorbundle import TensorBundleReader, TensorBundleSource, is_tensorbundle_index
from .torch_io import TorchSource, is_torch_file

__all__ = [
    "convert",
    "open_source",
    "detect_format",
    "resolve_prefix",
    "ConvertResult",
    "Source",
    "Spec",
    "TensorBundleReader",
    "SINK_FORMATS",
    "export_hf",
]

SINK_FORMATS = ("shardpoint", "safetensors", "hf")
_SP_MAGIC = b"SPINDEX\0"


def resolve_prefix(path: str) -> str:
    """A checkpoint prefix from what a user typed: ``P``, ``P.index``, or a manager directory
    (its latest checkpoint). Files and Hugging Face directories are returned unchanged.
    Object-store URLs: ``s3://b/dir/`` (trailing slash) is a manager directory, anything else a
    prefix."""
    if storage.is_url(path):
        if path.endswith("/"):
            latest = latest_checkpoint(path.rstrip("/"))
            if latest is None:
                raise NotFoundError(f"{path}: no checkpoint state object naming a checkpoint")
            return latest
        if path.endswith(".index"):
            return path[: -len(".index")]
        if is_manager_url(path):  # the directory as given to CheckpointManager, no slash
            return latest_checkpoint(path) or path
        return path
    # a checkpoint saved with hashed_prefixes=True has a directory ``P/`` beside ``P.index``
    # (FORMAT.md §3.1.1): the index says it is a prefix
    if os.path.isdir(path) and not is_hf_path(path) and not os.path.isfile(path + ".index"):
        latest = latest_checkpoint(path)
        if latest is None:
            return _only_checkpoint(path)
        return latest
    if path.endswith(".index") and os.path.isfile(path) and not os.path.exists(path + ".index"):
        return path[: -len(".index")]
    return path


def is_manager_url(url: str) -> bool:
    """Whether object-store ``url`` (no trailing slash) names a checkpoint directory (its state
    object names a checkpoint) rather than a checkpoint prefix (``url.index`` exists)."""
    return not storage.exists(url) and latest_checkpoint(url) is not None


def _only_checkpoint(directory: str) -> str:
    """The checkpoint of a directory without a state file, when it holds exactly one (as
    ``shardpoint ls`` lists them: its ``*.index`` files); otherwise a clear error."""
    # a serving directory's whole model before its tensor-parallel pieces (storage.paths)
    whole = checkpoints_in(directory)
    if len(whole) == 1:
        return whole[0]
    found = sorted(f[: -len(".index")] for f in os.listdir(directory) if f.endswith(".index"))
    if len(found) == 1:
        return os.path.join(directory, found[0])
    if not found:
        # data shards whose index is gone say so, not "no checkpoint"
        raise lost_index(directory) or NotFoundError(
            f"{directory}: directory holds no checkpoint (no state file, no *.index)"
        )
    raise InvalidArgumentError(
        f"{directory}: directory has no checkpoint state file and {len(found)} checkpoints "
        f"({', '.join(found[:5])}{', ...' if len(found) > 5 else ''}); name one"
    )


def detect_format(path: str) -> tuple[str, str]:
    """``(format, resolved path)`` of a source, from its magic bytes (a directory holding
    ``*.safetensors.index.json`` or ``.safetensors`` files, or such an index, is ``"hf"``)."""
    if (
        os.path.isdir(path)
        and is_hf_path(path)
        or path.endswith(".index.json")
        and is_hf_path(path)
    ):
        return "hf", path
    path = resolve_prefix(path)
    if storage.is_url(path):
        if not storage.exists(path):
            raise NotFoundError(f"{path}: no checkpoint ({path}.index not found)")
        return "shardpoint", path
    if os.path.isfile(path):
        if storage.is_single_file(path):
            return "shardpoint", path  # a single-file checkpoint (FORMAT.md §10)
        if is_safetensors(path):
            return "safetensors", path
        if is_torch_file(path):
            return "torch", path
        if path.endswith(".safetensors"):
            # named safetensors but too short to carry even its header length and "{"
            raise CorruptCheckpointError(
                f"{path}: damaged safetensors file (truncated before the end of its header)"
            )
        raise InvalidArgumentError(
            f"{path}: unknown file format (expected safetensors, a PyTorch file, or a checkpoint "
            "prefix with a .index file)"
        )
    index = path + ".index"
    try:
        with open(index, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise lost_index(path) or NotFoundError(
            f"{path}: no such file or checkpoint ({index} not found)"
        ) from None
    except IsADirectoryError:
        raise InvalidArgumentError(f"{index} is a directory") from None
    if head == _SP_MAGIC:
        return "shardpoint", path
    if is_tensorbundle_index(index):
        return "tensorflow", path
    raise CorruptCheckpointError(f"{index}: neither a shardpoint nor a TensorFlow checkpoint index")


def open_source(path: str) -> Source:
    """Open any supported format for reading (see :func:`detect_format`)."""
    fmt, p = detect_format(path)
    if fmt == "shardpoint" and p != path and os.path.isdir(path):
        source = ShardpointSource(p)
        source.keep_files_of(path)  # a serving directory: config.json beside the checkpoint
        return source
    cls: Callable[[str], Source] = {
        "shardpoint": ShardpointSource,
        "safetensors": SafetensorsSource,
        "torch": TorchSource,
        "tensorflow": TensorBundleSource,
        "hf": HFSource,
    }[fmt]
    return cls(p)


def _sink_format(dst: str, to: str | None) -> str:
    if to is None:
        return "safetensors" if dst.endswith(".safetensors") else "shardpoint"
    if to not in SINK_FORMATS:
        raise InvalidArgumentError(f"cannot write {to!r}; destinations: {', '.join(SINK_FORMATS)}")
    return to


def _exists(dst: str, fmt: str) -> bool:
    if fmt == "hf":
        return os.path.exists(dst) and (not os.path.isdir(dst) or bool(os.listdir(dst)))
    if storage.is_url(dst):
        return bool(storage.exists(dst))
    return os.path.exists(dst + ".index") if fmt == "shardpoint" else os.path.exists(dst)


def convert(
    src: str,
    dst: str,
    *,
    to: str | None = None,
    compression: str | None = "zstd",
    level: int | None = None,
    shards: int | None = None,
    overwrite: bool = False,
    durable: bool = True,
    progress: bool | None = None,
    max_shard_size: int | str = "5GB",
) -> ConvertResult:
    """Convert checkpoint ``src`` (any readable format) into ``dst``.

    ``dst`` is a shardpoint prefix, or a safetensors file when it ends in ``.safetensors`` (or
    ``to="safetensors"``). An existing destination is refused unless ``overwrite``.
    ``compression``/``level``/``shards`` apply to shardpoint destinations; with ``to="hf"``
    ``dst`` is a directory of shards of at most ``max_shard_size`` (see :func:`export_hf`). Values stream through
    one at a time; skipped entries (non-tensors into safetensors, TensorFlow string tensors...)
    are listed in the result's ``notes``.
    """
    fmt = _sink_format(dst, to)
    dst = os.fspath(dst)
    remote = storage.is_url(dst)
    if remote and fmt != "shardpoint":
        raise InvalidArgumentError(
            f"{dst}: only shardpoint checkpoints are written to object stores"
        )
    if fmt == "shardpoint" and (
        not dst or dst.endswith(os.sep) or dst.endswith("/") or (not remote and os.path.isdir(dst))
    ):
        raise InvalidArgumentError(
            f"destination {dst!r} must be a checkpoint prefix, not a directory"
        )
    with open_source(src) as source:
        same = source.path == dst or (
            not remote and os.path.abspath(source.path) == os.path.abspath(dst)
        )
        if same:
            raise InvalidArgumentError(f"source and destination are the same: {dst}")
        if not overwrite and _exists(dst, fmt):
            raise InvalidArgumentError(f"destination {dst} exists (pass overwrite / --force)")
        if not remote:  # missing parents are created, as for every writer
            make_dirs(os.path.dirname(dst))
        if fmt == "hf":
            return write_hf(
                source,
                dst,
                max_shard_size=max_shard_size,
                overwrite=overwrite,
                durable=durable,
                progress=progress,
            )
        if fmt == "safetensors":
            return write_safetensors(source, dst, durable=durable, progress=progress)
        return write_shardpoint(
            source,
            dst,
            compression=compression,
            level=level,
            shards=shards,
            durable=durable,
            progress=progress,
        )
