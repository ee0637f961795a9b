"""Writing Hugging Face safetensors directories: ``sp.export_hf`` and ``convert --to hf``.

Shards are split and named exactly as ``huggingface_hub.save_torch_state_dict`` does it
(``split_state_dict_into_shards_factory``): tensors are taken in the source's key order and
appended to the current shard until the next one would push it past ``max_shard_size``; a tensor
larger than the limit gets a shard of its own; files are ``model.safetensors`` for one shard, else
``model-00001-of-0000N.safetensors`` plus ``model.safetensors.index.json``
(``{"metadata": {"total_size": N, ...}, "weight_map": {...}}``, written with ``indent=2``). Each
shard carries ``{"format": "pt"}`` as its ``__metadata__`` (a single file also carries the
source's metadata, as the hub does).

The export streams: one tensor is read from the source and written at a time, never the whole
checkpoint. It is atomic: everything is written into a temporary sibling directory, fsynced, and
renamed onto ``out_dir`` last, so a crash or error never leaves a directory that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from ..errors import InvalidArgumentError
from ..storage import Reader
from ..storage.atomic_files import fsync_dir, make_dirs
from ..storage.progress import progress_bar
from .base import ConvertResult, Source, Spec
from .hf import HFSource, is_hf_path
from .hf_files import SECTION, collect_files, with_dtype, write_files
from .safetensors_io import FORMAT_TO_ST, write_safetensors
from .shardpoint_io import ShardpointSource

__all__ = ["export_hf", "write_hf", "parse_size", "plan_shards", "FILENAME_PATTERN"]

FILENAME_PATTERN = "model{suffix}.safetensors"
_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def parse_size(size: int | str) -> int:
    """Bytes from ``5GB``/``500MB``/an int: decimal units, as ``huggingface_hub`` reads them."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size <= 0:
            raise InvalidArgumentError(f"max_shard_size must be positive, got {size}")
        return size
    if not isinstance(size, str):
        raise InvalidArgumentError(
            f"max_shard_size must be an int or a str like '5GB', got {size!r}"
        )
    s = size.strip()
    unit = s[-2:].upper()
    if unit not in _UNITS:
        raise InvalidArgumentError(f"max_shard_size {size!r}: unit must be one of TB, GB, MB, KB")
    try:
        value = float(s[:-2].strip())
    except ValueError:
        raise InvalidArgumentError(f"max_shard_size {size!r}: not a number") from None
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise InvalidArgumentError(f"max_shard_size must be positive, got {size!r}")
    return n


def plan_shards(specs: list[Spec], max_shard_size: int) -> list[list[Spec]]:
    """The hub's split: in order, a new shard when the next tensor would overflow the current
    one; a tensor bigger than the limit alone in its own shard (the current one stays open)."""
    shards: list[list[Spec]] = []
    cur: list[Spec] = []
    cur_size = 0
    for s in specs:
        if s.nbytes > max_shard_size:
            shards.append([s])
            continue
        if cur_size + s.nbytes > max_shard_size:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(s)
        cur_size += s.nbytes
    if cur:
        shards.append(cur)
    return shards


class _ShardSource(Source):
    """A subset of another source's entries with its own per-file metadata."""

    def __init__(self, inner: Source, specs: list[Spec], metadata: dict[str, Any]) -> None:
        super().__init__(inner.path)
        self.format = inner.format
        self._inner, self._specs, self.metadata = inner, specs, metadata

    def specs(self) -> list[Spec]:
        return list(self._specs)

    def read(self, key: str) -> Any:
        return self._inner.read(key)


def _str_meta(meta: dict[str, Any]) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}


def write_hf(
    source: Source,
    out_dir: str,
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    durable: bool = True,
    progress: bool | None = None,
) -> ConvertResult:
    """Stream ``source`` into a new Hugging Face directory ``out_dir`` (see the module doc).

    ``out_dir`` must not exist, or be an empty directory, unless ``overwrite`` (then the old
    directory is replaced as a whole once the new one is complete). Non-tensor values and dtypes
    safetensors has no tag for are skipped and listed in the result's ``notes``.
    """
    limit = parse_size(max_shard_size)
    out_dir = os.path.abspath(os.fspath(out_dir))
    parent = os.path.dirname(out_dir)
    make_dirs(parent)  # missing parents are created, as for every writer
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise InvalidArgumentError(f"destination {out_dir} exists and is not a directory")
        if os.listdir(out_dir) and not overwrite:
            raise InvalidArgumentError(
                f"destination {out_dir} exists and is not empty (pass overwrite / --force)"
            )
    result = ConvertResult(source.format, "hf", notes=list(source.notes))
    specs = []
    for s in source.specs():
        if s.kind != "tensor":
            result.notes.append(
                f"skipped {s.key!r}: {s.kind} value (safetensors holds tensors only)"
            )
        elif s.dtype not in FORMAT_TO_ST:
            result.notes.append(f"skipped {s.key!r}: dtype {s.dtype} has no safetensors tag")
        else:
            specs.append(s)
    plan = plan_shards(specs, limit) or [[]]
    user_meta = _str_meta(source.metadata)
    n = len(plan)
    names = (
        [FILENAME_PATTERN.format(suffix="")]
        if n == 1
        else [FILENAME_PATTERN.format(suffix=f"-{i + 1:05d}-of-{n:05d}") for i in range(n)]
    )
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.", suffix=".tmp", dir=parent)
    bar = progress_bar(
        sum(s.nbytes for s in specs), f"export {os.path.basename(out_dir)}", progress=progress
    )
    try:
        for name, shard in zip(names, plan, strict=True):
            meta = {"format": "pt", **user_meta} if n == 1 else {"format": "pt"}
            sub = _ShardSource(source, shard, meta)
            done = write_safetensors(sub, os.path.join(tmp, name), durable=durable, progress=False)
            result.entries += done.entries
            result.raw_bytes += done.raw_bytes
            bar.update(done.raw_bytes)
        if n > 1:
            index = {
                "metadata": {"total_size": sum(s.nbytes for s in specs), **user_meta},
                "weight_map": {
                    s.key: name for name, shard in zip(names, plan, strict=True) for s in shard
                },
            }
            with open(
                os.path.join(tmp, FILENAME_PATTERN.format(suffix="") + ".index.json"), "w"
            ) as f:
                json.dump(index, f, indent=2)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        taken = set(names) | {FILENAME_PATTERN.format(suffix="") + ".index.json"}
        # config.json says the weights' dtype: vLLM reads it (a directory without *.safetensors
        # headers gives it nothing else to go by)
        dtypes: dict[str, int] = {}
        for s in specs:
            if s.dtype in ("bfloat16", "float16", "float32", "float64"):
                dtypes[s.dtype] = dtypes.get(s.dtype, 0) + s.nbytes
        kept = write_files(
            with_dtype(
                (getattr(source, "sections", None) or {}).get(SECTION),
                max(dtypes, key=lambda d: dtypes[d]) if dtypes else None,
            ),
            tmp,
            taken=taken,
            where=source.path,
            durable=durable,
            notes=result.notes,
        )
        if kept:
            result.notes.append(
                f"wrote {kept} kept files (config, tokenizer...) beside the weights"
            )
        os.chmod(tmp, 0o777 & ~_umask())
        if durable:
            fsync_dir(tmp)
        _publish(tmp, out_dir)
        if durable:
            fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    return result


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def _publish(tmp: str, out_dir: str) -> None:
    """Rename the finished ``tmp`` onto ``out_dir``; an existing non-empty one is moved aside
    first and deleted after (rename cannot replace a non-empty directory)."""
    try:
        os.rename(tmp, out_dir)  # atomic; also replaces an empty directory
        return
    except OSError:
        if not os.path.isdir(out_dir):
            raise
    old = tempfile.mkdtemp(
        prefix=f".{os.path.basename(out_dir)}.", suffix=".old", dir=os.path.dirname(out_dir)
    )
    os.rmdir(old)
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def export_hf(
    src: Any,
    out_dir: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    durable: bool = True,
    progress: bool | None = None,
) -> ConvertResult:
    """Export a checkpoint as a Hugging Face safetensors directory, tensor by tensor.

    Args:
        src: a shardpoint prefix, a Hugging Face directory, or an open
            :class:`shardpoint.Reader` (also one returned by ``sp.open`` on an HF directory).
            Other formats go through ``shardpoint.convert.convert(src, dst, to="hf")``.
        out_dir: the directory to create; it appears complete or not at all.
        max_shard_size: per-shard limit, ``"5GB"`` style (decimal units) or bytes.
        overwrite: replace an existing non-empty ``out_dir``.
        durable: fsync files and directories before returning.
        progress: progress bar (``None``: only when stderr is a terminal).

    Returns the :class:`ConvertResult` (entries, bytes, notes on skipped values).
    """
    if isinstance(src, Reader):
        source: Source = _ReaderSource(src)
        return write_hf(
            source,
            os.fspath(out_dir),
            max_shard_size=max_shard_size,
            overwrite=overwrite,
            durable=durable,
            progress=progress,
        )
    path = os.fspath(src)
    opened: Source = HFSource(path) if is_hf_path(path) else ShardpointSource(path)
    if isinstance(opened, ShardpointSource) and os.path.isdir(path):
        opened.keep_files_of(path)  # a serving directory: config.json beside the checkpoint
    with opened as source:
        return write_hf(
            source,
            os.fspath(out_dir),
            max_shard_size=max_shard_size,
            overwrite=overwrite,
            durable=durable,
            progress=progress,
        )


class _ReaderSource(Source):
    """An already open Reader as a source (not closed by the export)."""

    def __init__(self, reader: Any) -> None:
        super().__init__(reader.path)
        self.format = "hf" if hasattr(reader, "index_path") else "shardpoint"
        self._r = reader
        meta = reader.metadata if isinstance(reader.metadata, dict) else {}
        drop = ("total_size", "format") if self.format == "hf" else ()
        self.metadata = {k: v for k, v in meta.items() if k not in drop}
        if self.format == "hf":  # the directory's own config and tokenizer files
            kept = collect_files(reader.directory, self.notes)
            self.sections: dict[str, Any] = {} if kept is None else {SECTION: kept}
        else:
            self.sections = dict(reader.sections)

    def specs(self) -> list[Spec]:
        out = []
        for key in self._r.keys():
            i = self._r.info(key)
            out.append(Spec(key, i.dtype, i.shape, i.raw_bytes, i.kind))
        return out

    def read(self, key: str) -> Any:
        return self._r.get(key, verify=True)
