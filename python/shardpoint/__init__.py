"""shardpoint: fast, compressed, checksummed checkpoints for machine learning.

The public API (names are a contract):

- files: :func:`save_file`, :func:`load_file`, :func:`open` (lazy reader), :class:`Writer`,
  :func:`merge` (multi-writer commit), :func:`wait_for_cleanups`, :func:`exists`, :func:`remove`;
- errors: :class:`CheckpointError` and its subclasses;
- object-based checkpointing (``Variable``, ``Module``, ``Checkpoint``, ``CheckpointManager``...)
  from :mod:`shardpoint.objgraph`; ``shardpoint.activation`` and ``shardpoint.torch`` need PyTorch and are
  imported explicitly.
"""

from __future__ import annotations

from ._core import FORMAT_VERSION
from .errors import (
    BaseMismatchError,
    CheckpointError,
    CheckpointIOError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    DigestMismatchError,
    DigestMissingError,
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidKeyError,
    MissingKeyError,
    NotFoundError,
    PickleRefusedError,
    SignatureError,
    SignatureMissingError,
    TierError,
    UnregisteredTypeError,
    UnregisteredTypeWarning,
    UnsupportedDTypeError,
    UnsupportedFormatError,
)
from .storage import (
    EntryInfo,
    Reader,
    Writer,
    exists,
    load_file,
    merge,
    open,
    remove,
    save_file,
    wait_for_cleanups,
)
from .storage.objects import add_safe_types, register_type, registered_types, safe_types

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointIOError",
    "TierError",
    "TieredCheckpointManager",
    "ChecksumMismatchError",
    "CorruptCheckpointError",
    "BaseMismatchError",
    "DigestMismatchError",
    "DigestMissingError",
    "DuplicateKeyError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "MissingKeyError",
    "NotFoundError",
    "PickleRefusedError",
    "SignatureError",
    "SignatureMissingError",
    "UnregisteredTypeError",
    "UnregisteredTypeWarning",
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
    "wait_for_cleanups",
    "add_safe_types",
    "register_type",
    "registered_types",
    "safe_types",
]

# --- object graph API (shardpoint.objgraph) ---
from .objgraph import (
    Checkpoint,
    CheckpointLoadStatus,
    CheckpointManager,
    CheckpointReader,
    CheckpointStateError,
    DictWrapper,
    DirectoryInUseError,
    DTypeMismatchError,
    DuplicateDependencyError,
    InitializationOnlyStatus,
    ListWrapper,
    LoadStatusError,
    Module,
    NoDependency,
    NotTrackableError,
    RestoreMismatchError,
    ShapeMismatchError,
    SlotProvider,
    SlotReuseError,
    StateDictTrackable,
    StatePathConflictError,
    Trackable,
    TupleWrapper,
    UnsaveableObjectError,
    ValueSpec,
    Variable,
    latest_checkpoint,
    list_variables,
    load_checkpoint,
    load_variable,
    register_trackable_adapter,
    unregister_trackable_adapter,
)
from .objgraph.trackable import declare_adapter_module as _declare_adapter_module
from .storage import declare_delta as _declare_delta
from .storage import declare_framework as _declare_framework
from .storage import declare_in_place_reader as _declare_in_place_reader
from .storage.objects import declare_tags as _declare_object_tags

# sp.open reads Hugging Face safetensors checkpoints in place (shardpoint.convert.hf, imported
# only when a path without a P.index needs it).
_declare_in_place_reader("shardpoint.convert.hf", "is_hf_path", "HFReader")
# save_file(..., delta=True) writes, and sp.open resolves, delta checkpoints with shardpoint.delta
_declare_delta("shardpoint.delta")

# Once torch is imported, the first adapter lookup imports shardpoint.torch, which registers the
# torch adapters: every torch object (user subclasses included) gets them whatever the import
# order, and ``import shardpoint`` alone never imports torch. Declared here, where both layers
# are known.
_declare_adapter_module("torch", "shardpoint.torch")
# Once keras is imported, likewise shardpoint.keras (Keras 3, any backend); declared after torch so
# that on the torch backend (a Keras layer is also a torch module) the Keras adapters win.
_declare_adapter_module("keras", "shardpoint.keras")

# sp.open(prefix, framework="pt"|"jax") hands tensors out through converters that live with
# their framework, imported on first use.
_declare_framework("pt", "shardpoint.torch.codec", "reader_tensor")
_declare_framework("jax", "shardpoint.jax.arrays", "to_jax")

# Python objects in checkpoints (FORMAT.md §6.1): the tags of torch's and OmegaConf's value types
# have their handlers beside those packages, imported when a value or a file needs them.
_declare_object_tags(
    "shardpoint.torch.objects", "torch", ["torch.Size", "torch.dtype", "torch.device"]
)
_declare_object_tags(
    "shardpoint.storage.omegaconf_objects",
    "omegaconf",
    ["omegaconf.DictConfig", "omegaconf.ListConfig"],
)

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
    "register_trackable_adapter",
    "unregister_trackable_adapter",
    "Variable",
]
# --- end object graph API ---

# --- Hugging Face export (issue 18); reading is sp.open(directory), declared above ---
import os as _os  # noqa: E402
from typing import Any as _Any  # noqa: E402

# multi-tier checkpoints (issue 43): local, peer and persistent tiers; docs/TIERS.md
from .tiers import TieredCheckpointManager  # noqa: E402


def export_hf(
    src: _Any,
    out_dir: str | _os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    overwrite: bool = False,
    durable: bool = True,
    progress: bool | None = None,
) -> _Any:
    """Export a checkpoint (shardpoint prefix, HF directory, or open Reader) as a Hugging Face
    safetensors directory, split and named as ``huggingface_hub.save_torch_state_dict`` does;
    see :func:`shardpoint.convert.hf_export.export_hf`."""
    from .convert.hf_export import export_hf as _export

    return _export(
        src,
        out_dir,
        max_shard_size=max_shard_size,
        overwrite=overwrite,
        durable=durable,
        progress=progress,
    )


__all__ += ["export_hf"]


# --- torch.load and Lightning's loaders read shardpoint's files (docs/INTEGRATIONS.md) ---
def _install_loaders() -> None:
    # The wheel installs this hook at interpreter start (shardpoint-loaders.pth); a source
    # checkout on PYTHONPATH gets it here. Imports nothing heavy (see _shardpoint_loaders).
    try:
        import _shardpoint_loaders as loaders
    except ImportError:  # a copy of the package without its sibling plugin folder
        return
    loaders.install()


_install_loaders()
