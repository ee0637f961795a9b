"""transformers' ``from_pretrained`` reading the models shardpoint wrote, in any process where
shardpoint is installed.

A user exports a model for serving (``shardpoint export SRC DIR``), converts one
(``shardpoint convert SRC P``) or trains with ``ShardpointTrainer(shardpoint_weights=
"compressed")``; their next script calls ``AutoModelForCausalLM.from_pretrained(DIR)`` and
transformers says "no file named model.safetensors", never "shardpoint". With this front the
call reads the model (``shardpoint.hf.from_pretrained``, or ``hf_trainer.from_pretrained`` for a
trainer checkpoint, which checks each weight's crc32c first).

Imported by ``_shardpoint_loaders`` only once transformers' ``modeling_utils`` or its auto
classes' ``auto_factory`` has run (never at interpreter start); standard library only until a
path turns out to be ours. A path transformers can read itself (any weights file it knows is
there), a hub id, or anything else goes to transformers' own function with the same arguments,
so its results and errors are unchanged.
"""

from __future__ import annotations

import os

from . import (
    _MARK,
    INDEX_MAGIC,
    MAGIC,
    _starts_with,
    dress,
    index_or_cut,
    local_path,
    refuse_missing_index,
)

MYPY = False
if MYPY:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = [
    "is_pretrained",
    "check_recorded_weights",
    "refuse_lost_index",
    "patch_modeling_utils",
    "patch_auto_factory",
]

#: ends of the weight files transformers reads itself: a directory with any of them is its own
_NATIVE = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".h5", ".msgpack")
#: a serving directory's whole model (``shardpoint export``); a trainer checkpoint's part
_PARTS = ("model", "shardpoint")


def _ours(index: str) -> bool:
    return _starts_with(index, INDEX_MAGIC)


def _native(directory: str, name: str) -> bool:
    """Whether ``name`` is a weights file transformers reads itself: by name, unless its
    bytes are a shardpoint single file (a ``ShardpointTrainer`` checkpoint's
    ``training_args.bin`` is one)."""
    if name == "model.ckpt.index":
        return True
    return name.endswith(_NATIVE) and not _starts_with(os.path.join(directory, name), MAGIC)


def is_pretrained(path: Any) -> bool:
    """Whether ``from_pretrained(path)`` names a shardpoint model transformers cannot read
    itself: a local directory without weight files transformers knows (``*.safetensors``,
    ``*.bin``, their index JSONs, ``*.h5``, ``*.msgpack``, ``model.ckpt.index``) holding
    ``model.index`` (a serving directory), ``shardpoint.index`` (a trainer checkpoint with its
    weights in the shardpoint part), either of them cut short (shardpoint's reader names the
    damaged file), or only tensor-parallel pieces (``model-rank-R-of-N.index``:
    shardpoint's error says so by name); or a checkpoint prefix ``P`` whose ``P.index`` is ours
    (``shardpoint convert`` keeps config.json inside). Never raises."""
    try:
        p = local_path(path)
        if p is None:
            return False
        if os.path.isdir(p):
            names = os.listdir(p)
            if any(_native(p, n) for n in names):
                return False
            if any(index_or_cut(os.path.join(p, part + ".index")) for part in _PARTS):
                return True
            # only tensor-parallel pieces (`export --tp N`): ours to say so by name
            pieces = [n for n in names if n.startswith("model-rank-") and n.endswith(".index")]
            return bool(pieces) and _ours(os.path.join(p, pieces[0]))
        return _ours(p + ".index")
    except (OSError, ValueError, TypeError):
        return False


def refuse_lost_index(path: Any, who: str, corrupt: bool = False) -> None:
    """Raise shardpoint's error naming ``path`` when it is a checkpoint of ours whose
    ``model.index`` / ``shardpoint.index`` is gone while its data shards are there, and no
    weights file transformers reads itself is beside them (a ``ShardpointTrainer`` checkpoint
    with its ``model.safetensors`` still loads: those weights are whole). A prefix ``P`` of
    ``shardpoint convert`` whose ``P.index`` is gone too. Without it transformers said "no file
    named model.safetensors" and Trainer "Can't find a valid checkpoint": nothing about the
    index. ``corrupt``: ``CorruptCheckpointError`` (a ``ValueError``, as Trainer's error) in
    place of ``NotFoundError`` (an ``OSError``, as transformers')."""
    p = local_path(path)
    if p is None:
        return
    try:
        if os.path.isdir(p) and any(_native(p, n) for n in os.listdir(p)):
            return
    except OSError:
        return
    refuse_missing_index(p, who, _PARTS, corrupt)


def check_recorded_weights(path: Any) -> None:
    """If ``path`` is a local checkpoint directory of ours whose weights are files transformers
    reads itself (``model.safetensors``... beside ``shardpoint.index``, which records each
    weight's crc32c), check every weight against its record first: transformers checks
    nothing, and a flipped bit would otherwise load as a silently different model. Raises
    shardpoint's ``ChecksumMismatchError`` naming the file and tensor."""
    p = local_path(path)
    if p is None or not os.path.isdir(p):
        return
    if not _ours(os.path.join(p, "shardpoint.index")):
        return
    if not any(_native(p, n) for n in os.listdir(p)):
        return
    from shardpoint.integrations._weights_io import read_manifest, verify_weights

    manifest = read_manifest(os.path.join(p, "shardpoint"), "transformers")
    if manifest is not None:
        verify_weights(p, manifest)


def _front(original: Callable[..., Any], enabled: Callable[[], bool], env: str) -> Any:
    """A classmethod calling ``original`` (the function of transformers' classmethod) for every
    path but ours."""

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        path = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        sub = kwargs.get("subfolder") or ""
        where: Any = path
        if sub and isinstance(path, str | os.PathLike):
            where = os.path.join(os.fspath(path), sub)
        if not is_pretrained(where):
            if enabled():
                refuse_lost_index(where, "from_pretrained")
                check_recorded_weights(where)
            return original(cls, *args, **kwargs)
        if not enabled():
            raise OSError(
                f"{os.fspath(where)!r} is a shardpoint checkpoint, and from_pretrained's "
                f"reading of shardpoint checkpoints is turned off ({env}=0): read it with "
                f"shardpoint.hf.from_pretrained({cls.__name__}, path), or unset {env}"
            )
        rest = {
            k: v
            for k, v in kwargs.items()
            if k not in ("pretrained_model_name_or_path", "subfolder")
        }
        from shardpoint.integrations.pretrained import from_pretrained as ours

        return ours(cls, os.fspath(where), args[1:], rest)

    dress(from_pretrained, original)
    return classmethod(from_pretrained)


def _wrap(owner: type, enabled: Callable[[], bool], env: str) -> None:
    """Front ``owner``'s own ``from_pretrained`` classmethod (not an inherited one)."""
    current = owner.__dict__.get("from_pretrained")
    if not isinstance(current, classmethod) or hasattr(current.__func__, _MARK):
        return
    owner.from_pretrained = _front(current.__func__, enabled, env)  # type: ignore[attr-defined]


def patch_modeling_utils(module: ModuleType, enabled: Callable[[], bool], env: str) -> None:
    """Front ``PreTrainedModel.from_pretrained`` (a concrete model class's)."""
    owner = getattr(module, "PreTrainedModel", None)
    if isinstance(owner, type):
        _wrap(owner, enabled, env)


def patch_auto_factory(module: ModuleType, enabled: Callable[[], bool], env: str) -> None:
    """Front the auto classes' ``from_pretrained``: the base's (each ``AutoModel*`` copies it
    when ``modeling_auto`` defines it) and those of auto classes defined already. The auto
    class must be fronted too: it reads config.json before it calls the concrete class, and a
    converted checkpoint prefix has none on disk."""
    base = getattr(module, "_BaseAutoModelClass", None)
    if not isinstance(base, type):
        return
    todo = [base]
    while todo:
        owner = todo.pop()
        _wrap(owner, enabled, env)
        todo.extend(owner.__subclasses__())
