"""shardpoint checkpoints as a conversion source and as a streaming sink."""

from __future__ import annotations

import math
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import storage
from ..errors import ChecksumMismatchError
from ..storage.progress import progress_bar
from .base import ConvertResult, Source, Spec
from .hf_files import SECTION, collect_files

__all__ = ["ShardpointSource", "write_shardpoint"]

#: Same policy as ``save_file``: one shard (and one writer thread) per 256 MiB.
_BYTES_PER_SHARD = 256 << 20


class ShardpointSource(Source):
    """A shardpoint checkpoint read lazily; every value is checksum-verified as it is read."""

    format = "shardpoint"

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.reader = storage.open(prefix)
        self.metadata = dict(self.reader.metadata)
        #: shardpoint's own metadata sections (the torch layer's nesting...), carried over
        self.sections = dict(self.reader.sections)

    def keep_files_of(self, directory: str) -> None:
        """Carry the config and tokenizer files of ``directory``, the serving directory
        (``shardpoint export``) this checkpoint was named by, when the checkpoint keeps none
        itself: an export to Hugging Face needs them beside the weights."""
        has_config = os.path.isfile(os.path.join(directory, "config.json"))
        if SECTION not in self.sections and has_config:
            kept = collect_files(directory, self.notes)
            if kept is not None:
                self.sections[SECTION] = kept

    def specs(self) -> list[Spec]:
        out = []
        for key in self.reader.keys():
            i = self.reader.info(key)
            out.append(Spec(key, i.dtype, i.shape, i.raw_bytes, i.kind))
        return out

    def read(self, key: str) -> Any:
        return self.reader.get(key, verify=True)

    def close(self) -> None:
        self.reader.close()


def _auto_shards(total: int) -> int:
    return max(1, min(os.cpu_count() or 1, math.ceil(total / _BYTES_PER_SHARD)))


def write_shardpoint(
    source: Source,
    dst: str,
    *,
    compression: str | None = "zstd",
    level: int | None = None,
    shards: int | None = None,
    durable: bool = True,
    progress: bool | None = None,
) -> ConvertResult:
    """Stream every entry of ``source`` into a new shardpoint checkpoint ``dst``.

    Values are read one at a time in the calling thread (reads are cheap mmap views) and
    compressed/written by ``shards`` writer threads with the GIL released; at most two values per
    thread are in flight, so memory stays bounded whatever the checkpoint size. When the source
    recorded checksums (TensorFlow), they are compared with the crc32c the writer computed over
    the very bytes it stored; on a mismatch the new checkpoint is removed and
    ``ChecksumMismatchError`` names the source key.
    """
    specs = source.specs()
    total = sum(s.nbytes for s in specs)
    n = int(shards) if shards else _auto_shards(total)
    result = ConvertResult(source.format, "shardpoint", notes=list(source.notes))
    writer = storage.Writer(
        dst,
        compression=compression,
        level=level,
        shards=n,
        durable=durable,
        metadata=source.metadata or None,
        _sections=getattr(source, "sections", None),
    )
    bar = progress_bar(total, f"convert {os.path.basename(dst)}", progress=progress)
    try:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="sp-convert") as pool:
            pending: deque[Future[None]] = deque()
            try:
                for spec in specs:
                    value = source.read(spec.key)
                    pending.append(pool.submit(writer.add, spec.key, value))
                    del value  # the future holds the only reference; freed once written
                    while len(pending) >= 2 * n:
                        pending.popleft().result()
                    result.entries += 1
                    result.raw_bytes += spec.nbytes
                    bar.update(spec.nbytes)
                while pending:
                    pending.popleft().result()
            except BaseException:
                # Ctrl-C (or a failed add): queued adds never start, running ones stop at their
                # next chunk, so leaving the pool (which waits for its threads) is quick.
                for f in pending:
                    f.cancel()
                writer.abort()
                raise
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    _check_source_crcs(source, dst, specs)
    return result


def _check_source_crcs(source: Source, dst: str, specs: list[Spec]) -> None:
    wanted = {s.key: source.expected_crc32c(s.key) for s in specs}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    if not wanted:
        return
    bad = None
    with storage.open(dst) as r:
        for key, crc in wanted.items():
            got = r.info(key).crc32c
            if got != crc:
                bad = (key, crc, got)
                break
    if bad is not None:
        storage.remove(dst)
        key, crc, got = bad
        raise ChecksumMismatchError(
            f"{source.location(key)}: checksum mismatch (key {key!r}): recorded 0x{crc:08x}, "
            f"data has 0x{got:08x}; nothing was written to {dst}"
        )
