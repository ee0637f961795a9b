# Stubs of the compiled module shardpoint._core (checked by `mypy.stubtest` in `make lint`).
from collections.abc import Sequence
from os import PathLike
from typing import final

import numpy as np
from typing_extensions import Buffer as _PyBuffer

# Anything with the buffer protocol; numpy declares it to type checkers only on Python 3.12+.
_Buffer = _PyBuffer | np.ndarray

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_LEVEL",
    "FORMAT_VERSION",
    "Buffer",
    "CheckpointReader",
    "RemoteReader",
    "Writer",
    "crc32c",
    "dtype_names",
    "exists",
    "gc",
    "is_remote",
    "list_dir",
    "merge",
    "object_delete",
    "object_get",
    "object_put",
    "remove",
    "save",
    "save_incremental",
    "stage_copy",
]

FORMAT_VERSION: int
DEFAULT_CHUNK_BYTES: int
DEFAULT_LEVEL: int

@final
class Buffer:
    def __len__(self) -> int: ...

@final
class CheckpointReader:
    def __new__(cls, prefix: str | PathLike[str]) -> CheckpointReader: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
    def keys(self) -> list[str]: ...
    def keys_with_prefix(self, prefix: str) -> list[str]: ...
    def info(
        self, key: str
    ) -> tuple[str, tuple[int, ...], str, str, int, int, int, int, int, int]: ...
    def get(
        self, key: str, verify: bool = False, copy: bool = False
    ) -> tuple[str, tuple[int, ...], str, Buffer]: ...
    def get_many(
        self, keys: list[str], verify: bool = False, copy: bool = False
    ) -> list[tuple[str, tuple[int, ...], str, Buffer]]: ...
    def verify_key(self, key: str) -> None: ...
    def read_range(self, key: str, lo: int, hi: int, out: _Buffer) -> None: ...
    def verify(self) -> None: ...
    def metadata_json(self) -> str: ...
    def shard_files(self) -> list[tuple[str, int]]: ...
    def index_size(self) -> int: ...
    def chunk_bytes(self) -> int: ...

@final
class RemoteReader:
    def __new__(cls, url: str, storage_options: dict[str, str] | None = None) -> RemoteReader: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
    def keys(self) -> list[str]: ...
    def keys_with_prefix(self, prefix: str) -> list[str]: ...
    def info(
        self, key: str
    ) -> tuple[str, tuple[int, ...], str, str, int, int, int, int, int, int]: ...
    def get(
        self, key: str, verify: bool = False, copy: bool = False
    ) -> tuple[str, tuple[int, ...], str, Buffer]: ...
    def get_many(
        self, keys: list[str], verify: bool = False, copy: bool = False
    ) -> list[tuple[str, tuple[int, ...], str, Buffer]]: ...
    def verify_key(self, key: str) -> None: ...
    def read_range(self, key: str, lo: int, hi: int, out: _Buffer) -> None: ...
    def verify(self) -> None: ...
    def metadata_json(self) -> str: ...
    def shard_files(self) -> list[tuple[str, int]]: ...
    def index_size(self) -> int: ...
    def chunk_bytes(self) -> int: ...

@final
class Writer:
    def __new__(
        cls,
        prefix: str,
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
    ) -> Writer: ...
    def add(self, key: str, dtype: str, kind: str, shape: list[int], data: _Buffer) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...

def save(
    prefix: str,
    items: Sequence[tuple[str, str, str, tuple[int, ...], _Buffer]],
    codec: str,
    level: int,
    chunk_bytes: int,
    shards: int,
    durable: bool,
    metadata_json: str,
    sections_json: str = ...,
    storage_options: dict[str, str] | None = None,
) -> None: ...
def merge(
    prefix: str,
    world_size: int,
    durable: bool = True,
    token: str | None = None,
    storage_options: dict[str, str] | None = None,
) -> None: ...
def stage_copy(srcs: Sequence[_Buffer], dsts: Sequence[_Buffer], with_crc: bool) -> list[int]: ...
def save_incremental(
    prefix: str | PathLike[str],
    items: list[tuple[str, str, str, tuple[int, ...], _Buffer]],
    crcs: list[int] | None,
    base: str | PathLike[str] | None,
    codec: str,
    level: int,
    chunk_bytes: int,
    solo_bytes: int,
    durable: bool,
    metadata_json: str,
    sections_json: str = ...,
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
def dtype_names() -> list[str]: ...
def crc32c(data: _Buffer, crc: int = 0) -> int: ...
