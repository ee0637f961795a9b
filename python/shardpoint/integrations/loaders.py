"""What ``torch.load`` returns for a checkpoint shardpoint wrote (the front installed by
``_shardpoint_loaders``: at interpreter start through ``shardpoint_loaders.pth``, and by
``import shardpoint``).

A user's next script reads a trainer's checkpoint the way it always has — ``torch.load(path)``,
``MyModel.load_from_checkpoint(path)``, ``Trainer.fit(ckpt_path=path)`` without the plugin,
``Fabric.load``, DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` — and gets what
``torch.load`` of the native file would give: the nested dict as saved, tensors placed by
``map_location``. Nothing is unpickled on this route, whatever ``weights_only`` says (so the
result is the same for ``True`` and ``False``); user types are built from the allow-list
(``shardpoint.add_safe_types``, and torch's own ``add_safe_globals``). One exception to "the
same": a ``ShardpointTrainer``'s ``training_args.bin`` comes back as the ``TrainingArguments``
object Trainer pickles there, and ``weights_only=False`` also lets a user subclass that is not
allow-listed be imported by name, as torch would (``_hf_args``).

Which reader, by content and the ``shardpoint.integration`` metadata the writer recorded:
a single file or prefix → :func:`shardpoint.torch.load`; a directory holding ``state.index``
written by the DeepSpeed engine → its tree with DeepSpeed's objects rebuilt
(``_deepspeed_objects``); any other such directory (Lightning's form of earlier versions) →
its tree.
"""

from __future__ import annotations

import os
from typing import Any

from .. import storage
from ..errors import InvalidArgumentError
from ..storage.paths import directory_prefix
from ._hf_args import RECORD, rebuild_args, trusted
from ._state import WRITER_KEY, load_tree, part_prefix

__all__ = ["model_weights", "torch_load"]

_PART = "state"


def _writer(prefix: str) -> str | None:
    with storage.open(prefix) as r:
        who = r.metadata.get(WRITER_KEY)
    return who if isinstance(who, str) else None


def torch_load(
    f: Any,
    map_location: Any = None,
    *,
    mmap: bool | None = None,
    weights_only: bool | None = None,
) -> Any:
    """``torch.load(f, map_location)`` for a checkpoint shardpoint wrote (a path, a directory
    of the integrations' form, or a seekable binary file object). ``weights_only`` changes
    nothing but which classes a ``training_args.bin`` may be built as (``_hf_args``)."""
    from ..torch.file_objects import is_file_object, stream_path

    if mmap is None:
        mmap = _default_mmap()
    if isinstance(f, str | os.PathLike) and os.path.isdir(os.fspath(f)):
        prefix = part_prefix(f, _PART)
        who = _writer(prefix)
        tree = load_tree(
            prefix, integration=who or "torch.load", device=map_location, copy=not mmap
        )
        if who == "deepspeed":
            from ._deepspeed_objects import decode_objects

            return decode_objects(tree)
        return tree
    if is_file_object(f):
        with stream_path(f) as path:
            return _single(path, map_location, mmap, weights_only, _name(f))
    return _single(f, map_location, mmap, weights_only, repr(os.fspath(f)))


def _default_mmap() -> bool:
    """What ``torch.load`` does when ``mmap`` is not given: torch's own default (``False``
    unless ``torch.utils.serialization.config.load.mmap`` says otherwise). Not our views: a
    script that loads a checkpoint, edits it and ``torch.save``s it to the same path truncates
    the file under them (upstream Lightning's ``test_load_from_checkpoint_warn_on_empty_state_dict``
    does exactly that); tensors in private memory outlive the file, as torch's do."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # a torch without the switch: its default is no mmap
        return False
    return bool(getattr(getattr(config, "load", None), "mmap", False))


def _name(f: Any) -> str:
    return repr(getattr(f, "name", None) or type(f).__name__)


def _single(path: Any, map_location: Any, mmap: bool | None, wo: bool | None, name: str) -> Any:
    """A single file or prefix: its tree, or the object a ``training_args.bin`` holds."""
    from ..torch import load as sp_load

    tree = sp_load(path, map_location, mmap=mmap)
    if isinstance(tree, dict) and "output_dir" in tree:  # only then worth a second open
        with storage.open(path) as r:
            record = r.metadata.get(RECORD)
        if isinstance(record, dict):
            return rebuild_args(tree, record, where=name, trust=trusted(wo))
    return tree


def model_weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The weights of the model in a checkpoint shardpoint wrote, as a flat state dict of CPU
    tensors: what accelerate's ``load_checkpoint_in_model`` reads from a ``model.safetensors``
    (the front ``_shardpoint_loaders`` installs hands it this for shardpoint's checkpoints).

    ``path``: a serving directory (``shardpoint export``), a checkpoint prefix
    (``shardpoint convert``, ``shardpoint.torch.save``) or its ``.index`` file, or a trainer
    checkpoint directory whose weights are in its shardpoint part (``ShardpointTrainer`` or
    ``ShardpointAccelerator`` with ``shardpoint_weights="compressed"``; each weight checked
    against its crc32c; of several prepared models the first, the one accelerate's
    ``model.safetensors`` holds). A checkpoint holding something else than one model's
    weights raises :class:`InvalidArgumentError` naming it."""
    p = os.fspath(path)
    if p.endswith(".index") and os.path.isfile(p):
        p = p[: -len(".index")]
    p = directory_prefix(p)
    who = _writer(p)
    root = os.path.dirname(p)
    if who == "hf_trainer":
        from .hf_trainer import _model_state

        return _model_state(root)
    if who == "accelerate":
        from .accelerate import load_checkpoint

        models = load_checkpoint(root)["models"]
        if not models:
            raise InvalidArgumentError(f"{p}: this accelerate checkpoint holds no model")
        return dict(models[0])
    from ..torch import load as sp_load

    state = sp_load(p, "cpu")
    import torch

    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        kind = f"a {who} checkpoint" if who else "a nested state"
        raise InvalidArgumentError(
            f"{p}: {kind}, not one model's weights (a flat dict of tensors); read it with "
            "shardpoint.torch.load"
        )
    return state
