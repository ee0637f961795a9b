"""``torch.load`` — and every loader built on it (Lightning's ``load_from_checkpoint``,
``Trainer.fit(ckpt_path=)``, ``Fabric.load``, DeepSpeed's ``zero_to_fp32``) — reads checkpoints
shardpoint wrote, in any process where shardpoint is installed.

Why a top-level package of its own and not inside ``shardpoint``: the hook is installed at
interpreter start by ``shardpoint_loaders.pth`` (a site-packages startup file the wheel ships),
so a user's *next* script — ``import torch; torch.load("epoch=3.ckpt")`` or
``MyModel.load_from_checkpoint(path)``, which never imports shardpoint — reads what the plugin
wrote. It must cost nothing until used: this module imports only the standard library, and it
imports ``shardpoint`` only when a file turns out to be one of ours.

How: a ``sys.meta_path`` finder wraps the loader of a few modules so that, once such a module
has run, its loader function is replaced by a front that sniffs the argument by content
(:func:`is_shardpoint`: 8 bytes of a file, or the index of a directory/prefix form) and hands
shardpoint's files to ``shardpoint.integrations.loaders``; every other argument goes to the
original function untouched (same arguments, same errors). Modules already imported when the
hook is installed are patched at once. ``SHARDPOINT_TORCH_LOAD=0`` in the environment turns
the reading off: ``torch.load`` of one of our files then raises ``pickle.UnpicklingError``
naming shardpoint and ``shardpoint.torch.load``, the call that reads it.

transformers' ``from_pretrained`` gets the same kind of front once its modules have run
(``pretrained.py``): a serving directory, a converted prefix or a trainer checkpoint holding
its weights compressed load through shardpoint; so does accelerate's
``load_checkpoint_in_model`` / ``load_checkpoint_and_dispatch`` (``checkpoint_in_model.py``),
a plain ``Trainer``'s resume from a ``ShardpointTrainer`` checkpoint (``trainer_resume.py``)
a plain ``Accelerator.load_state`` of a ``ShardpointAccelerator`` directory
(``accelerator_state.py``), orbax's ``CheckpointManager.restore(step)`` without args of a
step shardpoint's orbax handler saved (``orbax_types.py``), and DCP's ``dcp.load(sd,
checkpoint_id=P)`` / ``FileSystemReader(P)`` / ``dcp_to_torch_save(P, out)`` of a checkpoint
shardpoint's DCP writer wrote (``dcp_reader.py``), and SGLang's default load format on a
serving directory (``sglang_loader.py``).
The same switch turns them off.
"""

from __future__ import annotations

# Only modules every interpreter has loaded by the time site runs (this file is imported at
# startup in every process: importlib.abc, typing, functools or threading would add tens of
# milliseconds to each `python -c pass`).
import _thread
import os
import sys

# typing itself costs ~8 ms to import: mypy's own constant guards the type-only imports
MYPY = False
if MYPY:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

__all__ = [
    "ENV",
    "INDEX_MAGIC",
    "MAGIC",
    "install",
    "installed",
    "is_shardpoint",
    "missing_index",
    "patch_torch",
]

#: set to ``0`` to leave ``torch.load`` and Lightning's loader alone
ENV = "SHARDPOINT_TORCH_LOAD"
#: the first bytes of a single-file checkpoint (FORMAT.md §10)
MAGIC = b"SPSINGLE"
#: the first bytes of an index file (FORMAT.md §3)
INDEX_MAGIC = b"SPINDEX\0"
#: the part name the trainer integrations give the checkpoint inside a directory
#: (``epoch=1.ckpt/state.index``, ``mp_rank_00_model_states.pt/state.index``)
_DIR_PART = "state"
#: every part a checkpoint directory of ours may hold: the trainer integrations' ``state``, a
#: serving directory's ``model``, a Hugging Face / accelerate checkpoint's ``shardpoint``
_PARTS = (_DIR_PART, "model", "shardpoint")
_MARK = "__shardpoint_front__"
_LOCK = _thread.RLock()


def _enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _starts_with(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(magic)) == magic
    except OSError:
        return False


def _has_shards(prefix: str) -> bool:
    """Whether shardpoint data shards of ``prefix`` (``P.data-00003-of-00008``, any of them:
    shard 0 may be the one lost) are there: an index beside them whose bytes are not an index,
    or no index at all, is a damaged checkpoint of ours."""
    import re  # here, not at startup: every Python process imports this module

    d, base = os.path.split(prefix)
    shard = re.compile(re.escape(base) + r"\.data-[0-9]{5}-of-[0-9]{5}")
    try:
        return any(shard.match(n) for n in os.listdir(d or "."))
    except OSError:
        return False


def index_or_cut(path: str) -> bool:
    """Whether ``path`` is a shardpoint index, or one cut short (empty, or only the first bytes
    of the magic: a disk that filled up, a copy that stopped): shardpoint's reader then says
    which file is damaged, where the framework would only say it finds no checkpoint."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(INDEX_MAGIC))
    except OSError:
        return False
    return INDEX_MAGIC.startswith(head)


def missing_index(path: Any, parts: Sequence[str] = _PARTS) -> str | None:
    """The prefix ``P`` of a shardpoint checkpoint at ``path`` whose index ``P.index`` is gone
    while its data shards ``P.data-*`` are still there (a save killed before its commit, a copy
    or upload that left the index out, a cleanup that deleted it), or ``None``. ``path``: a
    prefix, its ``.index`` named in full, or a directory holding part ``state``, ``model`` or
    ``shardpoint`` (``parts``). Without it the frameworks' own loaders said "no file named
    model.safetensors", "Is a directory" or "No such file": nothing about shardpoint or the
    missing index. An existing file is never this (its reader reads it). Never raises."""
    try:
        p = local_path(path)
        if p is None or os.path.isfile(p):
            return None
        if os.path.isdir(p):
            prefixes = [os.path.join(p, part) for part in parts]
        else:
            prefixes = [p[: -len(".index")] if p.endswith(".index") else p]
        for prefix in prefixes:
            if not os.path.lexists(prefix + ".index") and _has_shards(prefix):
                return prefix
    except (OSError, ValueError, TypeError):
        pass
    return None


def refuse_missing_index(
    path: Any, who: str, parts: Sequence[str] = _PARTS, corrupt: bool = False
) -> None:
    """Raise shardpoint's error naming ``path`` and its missing index when
    :func:`missing_index` finds one (imports shardpoint only then): ``NotFoundError`` (a
    ``FileNotFoundError``: what torch, transformers and accelerate raise for a missing file), or
    ``CorruptCheckpointError`` (a ``ValueError``) with ``corrupt``, where the framework's own
    error is a ``ValueError`` ("Can't find a valid checkpoint")."""
    prefix = missing_index(path, parts)
    if prefix is None:
        return
    from shardpoint.storage.paths import index_missing

    raise index_missing(prefix, os.fspath(path), who, corrupt=corrupt)


def dress(front: Any, original: Any) -> Any:
    """Give ``front`` the names, docstring and attributes of the ``original`` it stands in
    front of (``inspect.signature`` follows ``__wrapped__``) and the mark that says it is ours,
    so that nothing is fronted twice; returns ``front``."""
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(front, attr, getattr(original, attr, None))
    front.__dict__.update(getattr(original, "__dict__", {}))
    front.__wrapped__ = original
    setattr(front, _MARK, original)
    return front


def local_path(path: Any) -> str | None:
    """``path`` as a local file-system path, or ``None`` for anything else (an object-store
    URL, a file object, an empty string)."""
    if not isinstance(path, str | os.PathLike):
        return None
    p = os.fspath(path)
    if not isinstance(p, str) or not p or "://" in p:
        return None
    return p


def is_shardpoint(f: Any) -> bool:
    """Whether ``f`` (a path or a seekable binary file object) holds a checkpoint shardpoint
    wrote: a single file (by its first bytes), a directory holding ``state.index`` (the
    trainer integrations' directory form), a prefix ``P`` whose ``P.index`` exists, or that
    ``P.index`` itself. Never
    raises: anything unreadable is not ours to answer."""
    try:
        if isinstance(f, str | os.PathLike):
            p = os.fspath(f)
            if not isinstance(p, str) or "://" in p:
                return False
            if os.path.isdir(p):
                return _starts_with(os.path.join(p, _DIR_PART + ".index"), INDEX_MAGIC)
            if os.path.isfile(p):
                # a single file, or a prefix's own index named in full (`ck.index`), also
                # when damaged if its data shards are beside it (shardpoint names the damage)
                if _starts_with(p, MAGIC):
                    return True
                return p.endswith(".index") and (
                    _starts_with(p, INDEX_MAGIC) or _has_shards(p[: -len(".index")])
                )
            # a prefix: ours only if its index is ours (TensorFlow's `model.ckpt.index` is
            # not), or it is damaged beside our data shards
            return _starts_with(p + ".index", INDEX_MAGIC) or (
                os.path.isfile(p + ".index") and _has_shards(p)
            )
        seekable = getattr(f, "seekable", None)
        if callable(seekable) and seekable() and callable(getattr(f, "read", None)):
            start = f.tell()
            try:
                head = f.read(len(MAGIC))
            finally:
                f.seek(start)
            return bool(head == MAGIC)
    except (OSError, ValueError, TypeError):
        return False
    return False


def _name(f: Any) -> str:
    if isinstance(f, str | os.PathLike):
        return repr(os.fspath(f))
    return repr(getattr(f, "name", f))


def _front(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.load`` reading shardpoint's files, everything else passed through unchanged."""

    def load(*args: Any, **kwargs: Any) -> Any:
        f = args[0] if args else kwargs.get("f")
        if not is_shardpoint(f):
            if _enabled():  # torch would only say "No such file" or "Is a directory"
                refuse_missing_index(f, "torch.load", (_DIR_PART,))
            return original(*args, **kwargs)
        if not _enabled():
            import pickle

            raise pickle.UnpicklingError(
                f"{_name(f)} is a shardpoint checkpoint, and torch.load's reading of "
                f"shardpoint files is turned off ({ENV}=0): read it with "
                "shardpoint.torch.load(path, map_location=...), or unset "
                f"{ENV}"
            )
        map_location = args[1] if len(args) > 1 else kwargs.get("map_location")
        p = local_path(f)
        if p is not None and p.endswith(".index") and not _starts_with(p, MAGIC):
            f = p[: -len(".index")]  # a prefix's index named in full: read as the prefix
        from shardpoint.integrations import loaders  # only now: a file of ours is being read

        return loaders.torch_load(
            f, map_location, mmap=kwargs.get("mmap"), weights_only=kwargs.get("weights_only")
        )

    dress(load, original)
    return load


def patch_torch(serialization: ModuleType) -> None:
    """Front ``torch.serialization.load`` (and ``torch.load`` when torch is imported)."""
    with _LOCK:
        current = getattr(serialization, "load", None)
        if current is None or hasattr(current, _MARK):
            return
        front = _front(current)
        serialization.load = front  # type: ignore[attr-defined]
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "load", None) is current:
            torch.load = front  # type: ignore[attr-defined]


def _patch_lightning(_module: ModuleType) -> None:
    """Let Lightning's loader read object-store prefixes and directory forms too (files
    already go through ``torch.load``)."""
    if not _enabled():
        return
    try:
        from shardpoint.integrations import _lightning_reader
    except Exception:  # shardpoint or its dependencies broken: torch.load's front still works
        return
    _lightning_reader.install(quiet=True)


def _patch_pretrained(name: str) -> Callable[[ModuleType], None]:
    """Front transformers' ``from_pretrained`` (``pretrained.py``, imported only now)."""

    def action(module: ModuleType) -> None:
        from . import pretrained

        getattr(pretrained, name)(module, _enabled, ENV)

    return action


def _patch_accelerate(module: ModuleType) -> None:
    """Front accelerate's ``load_checkpoint_in_model`` (``checkpoint_in_model.py``, imported
    only now)."""
    from . import checkpoint_in_model

    checkpoint_in_model.patch_modeling(module, _enabled, ENV)


def _patch_trainer(module: ModuleType) -> None:
    """Front a plain ``Trainer``'s resume from a ``ShardpointTrainer`` checkpoint
    (``trainer_resume.py``, imported only now)."""
    from . import trainer_resume

    trainer_resume.patch_trainer(module, _enabled, ENV)


def _patch_accelerator(module: ModuleType) -> None:
    """Front a plain ``Accelerator.load_state`` of a ``ShardpointAccelerator`` directory
    (``accelerator_state.py``, imported only now)."""
    from . import accelerator_state

    accelerator_state.patch_accelerator(module, _enabled, ENV)


def _patch_orbax(module: ModuleType) -> None:
    """Let orbax's ``restore(step)`` without args find shardpoint's handler type
    (``orbax_types.py``, imported only now)."""
    from . import orbax_types

    orbax_types.patch_registry(module)


def _patch_dcp(name: str) -> Callable[[ModuleType], None]:
    """Let DCP's own readers read shardpoint's DCP checkpoints (``dcp_reader.py``, imported
    only now)."""

    def action(module: ModuleType) -> None:
        from . import dcp_reader

        getattr(dcp_reader, name)(module, _enabled)

    return action


def _patch_sglang(module: ModuleType) -> None:
    """SGLang's default load format on a serving directory (``sglang_loader.py``, imported
    only now)."""
    from . import sglang_loader

    sglang_loader.patch_loader(module, _enabled)


#: module name -> what to do once it has run
_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "torch.serialization": patch_torch,
    "lightning.pytorch.core.saving": _patch_lightning,
    "pytorch_lightning.core.saving": _patch_lightning,
    "transformers.modeling_utils": _patch_pretrained("patch_modeling_utils"),
    "transformers.models.auto.auto_factory": _patch_pretrained("patch_auto_factory"),
    "accelerate.utils.modeling": _patch_accelerate,
    "transformers.trainer": _patch_trainer,
    "accelerate.accelerator": _patch_accelerator,
    "orbax.checkpoint._src.handlers.handler_type_registry": _patch_orbax,
    "torch.distributed.checkpoint._storage_utils": _patch_dcp("patch_storage_utils"),
    "torch.distributed.checkpoint.filesystem": _patch_dcp("patch_filesystem"),
    "sglang.srt.model_loader.loader": _patch_sglang,
}


class _AfterImport:
    """Finds nothing itself: for a target module it asks the other finders for the spec and
    wraps the loader so that the patch runs right after the module has executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        action = _TARGETS.get(fullname)
        if action is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    # a loader is a protocol: _Loader has its methods, not importlib.abc's base
                    spec.loader = _Loader(spec.loader, action)  # type: ignore[assignment]
                return spec
        return None


class _Loader:
    """The real loader, with the patch run after ``exec_module`` (a meta path finder and a
    loader are protocols: no importlib.abc base needed)."""

    def __init__(self, inner: Any, action: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._action = action

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            self._action(module)
        except Exception:  # never break the user's import over our convenience
            pass

    def __getattr__(self, name: str) -> Any:  # get_source, is_package... as the real loader
        return getattr(self._inner, name)


def installed() -> bool:
    """Whether the import hook is in place."""
    return any(isinstance(f, _AfterImport) for f in sys.meta_path)


def install() -> None:
    """Put the hook in place (idempotent) and patch the target modules already imported.
    With ``SHARDPOINT_TORCH_LOAD=0`` the front only refuses shardpoint's files with an error
    naming the call that reads them (``torch.load``'s own error would be "Unsupported
    operand 83"); every other file is read by torch as before."""
    with _LOCK:
        if not installed():
            sys.meta_path.insert(0, _AfterImport())
        for name, action in _TARGETS.items():
            module = sys.modules.get(name)
            if module is not None:
                try:
                    action(module)
                except Exception:
                    pass
