"""The storage face: checkpoints as files of named tensors and values.

Where to look: :mod:`.paths` (prefixes, URLs, exists/remove, object-store helpers),
:mod:`.save` (``save_file`` and its plan), :mod:`.reader` (``open``, ``Reader``, ``load_file``),
:mod:`.slicing` (lazy slices), :mod:`.writer` (``Writer``, ``merge``), :mod:`.values` and
:mod:`.objects` (what a value may be, Python objects never pickled), :mod:`.dtypes`,
:mod:`.io_mode` (mmap or pread), :mod:`.async_save`, :mod:`.strong_digest`. The names below are
the face the upper layers (object graph, frameworks, convert, CLI) use.
"""

from __future__ import annotations

from .direct_reads import read_ranges_direct
from .frameworks import (
    declare_delta,
    declare_framework,
    declare_in_place_reader,
    framework_converter,
)
from .paths import (
    SINGLE_FILE_SUFFIXES,
    PathLike,
    StorageOptions,
    crc32c,
    delete_object,
    exists,
    gc,
    is_single_file,
    is_url,
    list_url,
    read_object,
    remove,
    wants_single_file,
    write_object,
)
from .reader import (
    STATS_FIELDS,
    EntryInfo,
    Reader,
    load_file,
    open,
    read_ranges_into,
    stats_dict,
)
from .save import DIGEST_ALGORITHMS, SavePlan, plan_save, save_file
from .writer import Writer, merge, wait_for_cleanups

__all__ = [
    "save_file",
    "load_file",
    "open",
    "Reader",
    "Writer",
    "EntryInfo",
    "exists",
    "remove",
    "merge",
    "wait_for_cleanups",
    "PathLike",
    "StorageOptions",
    "SINGLE_FILE_SUFFIXES",
    "DIGEST_ALGORITHMS",
    "STATS_FIELDS",
    "SavePlan",
    "plan_save",
    "wants_single_file",
    "is_single_file",
    "is_url",
    "read_object",
    "write_object",
    "delete_object",
    "crc32c",
    "list_url",
    "gc",
    "read_ranges_into",
    "read_ranges_direct",
    "stats_dict",
    "declare_framework",
    "declare_in_place_reader",
    "declare_delta",
    "framework_converter",
]
