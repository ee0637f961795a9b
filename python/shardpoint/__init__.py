"""shardpoint: fast, compressed, checksummed checkpoints for machine learning.

The public API (names are a contract, see DESIGN.md §4):

- files: :func:`save_file`, :func:`load_file`, :func:`open` (lazy reader), :class:`Writer`,
  :func:`merge` (multi-writer commit), :func:`exists`, :func:`remove`;
- errors: :class:`CheckpointError` and its subclasses;
- object-based checkpointing (``Variable``, ``Module``, ``Checkpoint``, ``CheckpointManager``...)
  when present below; ``shardpoint.activation`` and ``shardpoint.torch`` need PyTorch and are
  imported explicitly.
"""

from __future__ import annotations

from ._core import FORMAT_VERSION
from .errors import (
    CheckpointError,
    CheckpointIOError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidKeyError,
    MissingKeyError,
    NotFoundError,
    UnsupportedDTypeError,
    UnsupportedFormatError,
)
from .files import EntryInfo, Reader, Writer, exists, load_file, merge, open, remove, save_file

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointIOError",
    "ChecksumMismatchError",
    "CorruptCheckpointError",
    "DuplicateKeyError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "MissingKeyError",
    "NotFoundError",
    "UnsupportedDTypeError",
    "UnsupportedFormatError",
    "EntryInfo",
    "Reader",
    "Writer",
    "exists",
    "load_file",
    "merge",
    "open",
    "remove",
    "save_file",
]

# --- object graph API (issue 3) ---
from .checkpoint import Checkpoint
from .checkpoint_reader import CheckpointReader, list_variables, load_checkpoint, load_variable
from .containers import DictWrapper, ListWrapper, TupleWrapper
from .graph_errors import (
    CheckpointStateError,
    DTypeMismatchError,
    DuplicateDependencyError,
    LoadStatusError,
    NotTrackableError,
    RestoreMismatchError,
    ShapeMismatchError,
    SlotReuseError,
    StatePathConflictError,
    UnsaveableObjectError,
)
from .manager import CheckpointManager
from .module import Module
from .restore import CheckpointLoadStatus, InitializationOnlyStatus
from .state_dict import StateDictTrackable
from .state_file import latest_checkpoint
from .tracking import (
    NoDependency,
    SlotProvider,
    Trackable,
    ValueSpec,
    register_trackable_adapter,
    unregister_trackable_adapter,
)
from .variables import Variable

__all__ += [
    "Checkpoint",
    "CheckpointReader",
    "list_variables",
    "load_checkpoint",
    "load_variable",
    "DictWrapper",
    "ListWrapper",
    "TupleWrapper",
    "CheckpointStateError",
    "DTypeMismatchError",
    "DuplicateDependencyError",
    "LoadStatusError",
    "NotTrackableError",
    "RestoreMismatchError",
    "ShapeMismatchError",
    "SlotReuseError",
    "StatePathConflictError",
    "UnsaveableObjectError",
    "CheckpointManager",
    "Module",
    "CheckpointLoadStatus",
    "InitializationOnlyStatus",
    "StateDictTrackable",
    "latest_checkpoint",
    "NoDependency",
    "SlotProvider",
    "Trackable",
    "ValueSpec",
    "register_trackable_adapter",
    "unregister_trackable_adapter",
    "Variable",
]
# --- end object graph API ---
