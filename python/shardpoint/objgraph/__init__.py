"""Object-based checkpointing: the trackable object graph and everything built on it.

Layer map (each module imports only those listed before it, plus the storage face
``shardpoint.storage``/``errors`` below this package; nothing here imports a framework):

- ``errors``: the graph's own exceptions (all subclasses of ``shardpoint.CheckpointError``);
- ``trackable``: the ``_sp_*`` protocol, ``NoDependency``, the adapter registry;
- ``variables``: ``Variable`` and ``SlotProvider`` (the slots are variables);
- ``wrappers``: ``ListWrapper``/``DictWrapper``/``TupleWrapper`` around tracked containers;
- ``module``: ``Module``, attribute assignment tracks dependencies;
- ``state_dict_adapter``: the fallback adapter for objects with ``state_dict()``;
- ``naming``: breadth-first naming, checkpoint keys, the object-graph JSON;
- ``restore``: matching a stored graph to live objects, deferred restore, load status;
- ``storage_io``: the one place this package touches storage;
- ``checkpoint_state``: the TF-style ``checkpoint`` state file of a directory;
- ``checkpoint``, ``checkpoint_reader``, ``manager``: the user-facing classes.

Framework adapters (``shardpoint.torch``) register themselves with ``trackable``; this package
never imports them. ``shardpoint`` re-exports the public names.
"""

from __future__ import annotations

from . import state_dict_adapter as _state_dict_adapter  # noqa: F401 - registers the fallback
from .checkpoint import Checkpoint
from .checkpoint_reader import CheckpointReader, list_variables, load_checkpoint, load_variable
from .checkpoint_state import latest_checkpoint
from .errors import (
    CheckpointStateError,
    DirectoryInUseError,
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
from .load_status import CheckpointLoadStatus, InitializationOnlyStatus
from .manager import CheckpointManager
from .module import Module
from .state_dict_adapter import StateDictTrackable
from .trackable import (
    NoDependency,
    Trackable,
    ValueSpec,
    declare_adapter_module,
    register_trackable_adapter,
    unregister_trackable_adapter,
)
from .variables import SlotProvider, Variable
from .wrappers import DictWrapper, ListWrapper, TupleWrapper

__all__ = [
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
    "DirectoryInUseError",
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
    "declare_adapter_module",
    "register_trackable_adapter",
    "unregister_trackable_adapter",
    "Variable",
]
