# Stubs of the compiled module shardpoint._core (checked by `mypy.stubtest` in `make lint`).
from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any, final

import numpy as np
from typing_extensions import Buffer as _PyBuffer

# Anything with the buffer protocol; numpy declares it to type checkers only on Python 3.12+.
_Buffer = _PyBuffer | np.ndarray
#: An index record in ``EntryInfo``'s field order (``infos``).
_InfoTuple = tuple[str, str, tuple[int, ...], str, str, int, int, int, int, int, int, int]

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_LEVEL",
    "FORMAT_VERSION",
    "MAX_OBJECT_BYTES",
    "Buffer",
    "CheckpointReader",
    "EntryRecord",
    "EntryValue",
    "RemoteReader",
    "Writer",
    "crc32c",
    "crc32c_many",
    "encode_single",
    "encoded_sizes",
    "xor_into",
    "xor_stats",
    "digest_bytes",
    "read_file_ranges",
    "read_file_ranges_direct",
    "parse_safetensors_header",
    "dtype_names",
    "error_class_names",
    "exists",
    "gc",
    "is_remote",
    "int_attr_rows",
    "is_single_file",
    "list_dir",
    "merge_order_stats",
    "forget_merge_orders",
    "merge",
    "merge_in_memory",
    "pending_cleanups",
    "wait_for_cleanups",
    "object_delete",
    "object_get",
    "object_put",
    "remove",
    "save",
    "save_incremental",
    "stage_copy",
    "stats_buffer",
    "diff_buffers",
]

FORMAT_VERSION: int
DEFAULT_CHUNK_BYTES: int
DEFAULT_LEVEL: int
#: The largest object entry a reader accepts or a writer writes (FORMAT.md §6.1).
MAX_OBJECT_BYTES: int

@final
class Buffer:
    def __len__(self) -> int: ...

@final
class EntryRecord:
    """What the index records about one entry."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def kind(self) -> str: ...
    @property
    def codec(self) -> str: ...
    @property
    def stored_len(self) -> int: ...
    @property
    def raw_len(self) -> int: ...
    @property
    def shard(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def crc32c(self) -> int: ...
    @property
    def nchunks(self) -> int: ...
    @property
    def crc_blocks(self) -> int: ...

@final
class EntryValue:
    """One value read from a checkpoint."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def kind(self) -> str: ...
    @property
    def buffer(self) -> Buffer: ...

@final
class CheckpointReader:
    def __new__(cls, prefix: str | PathLike[str]) -> CheckpointReader: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
    def keys(self) -> list[str]: ...
    def keys_with_prefix(self, prefix: str) -> list[str]: ...
    def info(self, key: str) -> EntryRecord: ...
    def infos(self, keys: list[str]) -> list[_InfoTuple]: ...
    def get(self, key: str, verify: bool = False, copy: bool = False) -> EntryValue: ...
    def get_many(
        self, keys: list[str], verify: bool = False, copy: bool = False
    ) -> list[EntryValue]: ...
    def stats(self, keys: list[str]) -> list[_StatsTuple]: ...
    def verify_key(self, key: str) -> None: ...
    def read_many_into(
        self,
        keys: list[str],
        outs: Sequence[_Buffer],
        verify: bool = True,
        threads: int | None = None,
        direct: int | None = None,
        follow_cache: bool = True,
    ) -> tuple[int, int, int] | None: ...
    def first_mismatch(
        self, keys: list[str], dtypes: list[str], shapes: Sequence[Sequence[int]]
    ) -> int | None: ...
    def verify_views(self, keys: list[str], outs: Sequence[_Buffer]) -> None: ...
    def read_range(
        self, key: str, lo: int, hi: int, out: _Buffer, verify: bool = False
    ) -> None: ...
    def read_ranges_into(
        self,
        keys: list[str],
        los: list[int],
        his: list[int],
        outs: Sequence[_Buffer],
        verify: bool = False,
    ) -> None: ...
    def verify(self) -> None: ...
    def verify_strong(
        self,
    ) -> tuple[str, str, int, int, list[tuple[str, str]]] | None: ...
    def metadata_json(self) -> str: ...
    def shard_files(self) -> list[tuple[str, int]]: ...
    def is_single_file(self) -> bool: ...
    def index_path(self) -> str: ...
    def format_version(self) -> int: ...
    def index_size(self) -> int: ...
    def chunk_bytes(self) -> int: ...

@final
class RemoteReader:
    def __new__(cls, url: str, storage_options: dict[str, str] | None = None) -> RemoteReader: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
    def keys(self) -> list[str]: ...
    def keys_with_prefix(self, prefix: str) -> list[str]: ...
    def info(self, key: str) -> EntryRecord: ...
    def infos(self, keys: list[str]) -> list[_InfoTuple]: ...
    def get(self, key: str, verify: bool = False, copy: bool = False) -> EntryValue: ...
    def get_many(
        self, keys: list[str], verify: bool = False, copy: bool = False
    ) -> list[EntryValue]: ...
    def verify_key(self, key: str) -> None: ...
    def read_many_into(
        self, keys: list[str], outs: Sequence[_Buffer], verify: bool = True
    ) -> None: ...
    def read_range(self, key: str, lo: int, hi: int, out: _Buffer, verify: bool = True) -> None: ...
    def read_ranges_into(
        self,
        keys: list[str],
        los: list[int],
        his: list[int],
        outs: Sequence[_Buffer],
        verify: bool = True,
    ) -> None: ...
    def verify(self) -> None: ...
    def verify_strong(
        self,
    ) -> tuple[str, str, int, int, list[tuple[str, str]]] | None: ...
    def metadata_json(self) -> str: ...
    def shard_files(self) -> list[tuple[str, int]]: ...
    def format_version(self) -> int: ...
    def index_size(self) -> int: ...
    def chunk_bytes(self) -> int: ...

@final
class Writer:
    def __new__(
        cls,
        prefix: str,
        *,
        codec: str,
        level: int,
        chunk_bytes: int,
        shards: int,
        durable: bool,
        rank: int,
        world_size: int,
        metadata_json: str,
        merge_token: str = ...,
        sections_json: str = ...,
        storage_options: dict[str, str] | None = None,
        digest: str | None = None,
        hashed_prefixes: bool = False,
    ) -> Writer: ...
    def add(
        self,
        key: str,
        dtype: str,
        kind: str,
        shape: list[int],
        data: _Buffer,
        xor_base: _Buffer | None = None,
    ) -> None: ...
    def commit(self) -> None: ...
    def commit_partial(self) -> bytes | None: ...
    def cancel(self) -> None: ...
    def abort(self) -> None: ...

def save(
    prefix: str,
    items: Sequence[tuple[str, str, str, tuple[int, ...], _Buffer]],
    *,
    codec: str,
    level: int,
    chunk_bytes: int,
    shards: int,
    durable: bool,
    metadata_json: str,
    sections_json: str = ...,
    storage_options: dict[str, str] | None = None,
    progress: Callable[[int], object] | None = None,
    digest: str | None = None,
    single_file: bool = False,
    xor_bases: Sequence[_Buffer | None] | None = None,
    hashed_prefixes: bool = False,
) -> None: ...
def is_single_file(path: str | PathLike[str]) -> bool: ...
def merge(
    prefix: str,
    world_size: int,
    *,
    durable: bool = True,
    token: str | None = None,
    storage_options: dict[str, str] | None = None,
    wait_cleanup: bool = True,
    hashed_prefixes: bool = False,
) -> None: ...
def merge_in_memory(
    prefix: str,
    partials: Sequence[bytes],
    *,
    durable: bool = True,
    token: str | None = None,
    storage_options: dict[str, str] | None = None,
    wait_cleanup: bool = True,
    hashed_prefixes: bool = False,
) -> None: ...
def wait_for_cleanups() -> None: ...
def int_attr_rows(objs: list[Any], names: list[str], width: int) -> bytes | None: ...
def pending_cleanups() -> int: ...
def merge_order_stats() -> tuple[int, int]: ...
def forget_merge_orders() -> None: ...
def stage_copy(srcs: Sequence[_Buffer], dsts: Sequence[_Buffer], with_crc: bool) -> list[int]: ...
def save_incremental(
    prefix: str | PathLike[str],
    items: Sequence[tuple[str, str, str, tuple[int, ...], _Buffer]],
    *,
    crcs: list[int] | None,
    base: str | PathLike[str] | None,
    codec: str,
    level: int,
    chunk_bytes: int,
    solo_bytes: int,
    durable: bool,
    metadata_json: str,
    sections_json: str = ...,
    digest: str | None = None,
    hashed_prefixes: bool = False,
) -> tuple[int, int, int, int, str | None]: ...
def remove(prefix: str, storage_options: dict[str, str] | None = None) -> None: ...
def is_remote(prefix: str) -> bool: ...
def exists(prefix: str, storage_options: dict[str, str] | None = None) -> bool: ...
def object_get(
    url: str, storage_options: dict[str, str] | None = None
) -> tuple[bytes, str | None]: ...
def object_put(
    url: str,
    data: bytes,
    mode: str = "overwrite",
    etag: str | None = None,
    storage_options: dict[str, str] | None = None,
) -> str | None: ...
def object_delete(url: str, storage_options: dict[str, str] | None = None) -> None: ...
def list_dir(url: str, storage_options: dict[str, str] | None = None) -> list[str]: ...
def gc(
    url: str, older_than: float = 3600.0, storage_options: dict[str, str] | None = None
) -> int: ...

# (count, finite, nan, pos_inf, neg_inf, zeros, min, max, mean, std, l2)
_StatsTuple = tuple[int, int, int, int, int, int, float, float, float, float, float]

def stats_buffer(data: _Buffer, dtype: str) -> _StatsTuple: ...
def diff_buffers(
    a: _Buffer, b: _Buffer, dtype: str
) -> tuple[int, int, int, float, float, float]: ...
def dtype_names() -> list[str]: ...
def crc32c(data: _Buffer, crc: int = 0) -> int: ...
def crc32c_many(bufs: Sequence[_Buffer]) -> list[int]: ...
def xor_stats(
    news: Sequence[_Buffer],
    bases: Sequence[_Buffer],
    widths: Sequence[int],
    outs: Sequence[_Buffer | None] | None = None,
) -> list[tuple[int, list[int], int, int, int]]: ...
def encode_single(
    items: Sequence[tuple[str, str, str, tuple[int, ...], _Buffer]],
    *,
    codec: str,
    level: int,
    chunk_bytes: int,
    metadata_json: str,
    sections_json: str = ...,
    xor_bases: Sequence[_Buffer | None] | None = None,
) -> bytes: ...
def encoded_sizes(
    items: Sequence[tuple[str, str, str, tuple[int, ...], _Buffer]],
    *,
    codec: str,
    level: int,
    chunk_bytes: int,
    xor_bases: Sequence[_Buffer | None] | None = None,
) -> list[int]: ...
def xor_into(reader: CheckpointReader, keys: list[str], outs: Sequence[_Buffer]) -> list[int]: ...
def digest_bytes(algorithm: str, data: _Buffer) -> str: ...
def read_file_ranges(
    paths: Sequence[str],
    ranges: Sequence[tuple[int, int]],
    outs: Sequence[_Buffer],
    threads: int | None = None,
) -> None: ...
def read_file_ranges_direct(
    paths: Sequence[str],
    ranges: Sequence[tuple[int, int]],
    outs: Sequence[_Buffer],
    depth: int | None = None,
    follow_cache: bool = True,
) -> tuple[int, int, int]: ...
def parse_safetensors_header(
    blob: bytes, data_len: int
) -> tuple[list[tuple[str, str, tuple[int, ...], int, int]], dict[str, str]] | None: ...
def error_class_names() -> list[str]: ...
