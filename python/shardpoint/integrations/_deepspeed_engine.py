"""The DeepSpeed ``CheckpointEngine`` subclass (imports DeepSpeed; reached through
``shardpoint.integrations.deepspeed``)."""

from __future__ import annotations

import functools
import inspect
import os
import weakref
from collections.abc import Callable
from typing import Any

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from ._deepspeed_objects import decode_objects, encode_objects
from ._state import PendingSaves, load_tree, module_targets, part_prefix, save_tree

__all__ = ["ShardpointCheckpointEngine"]

_PART = "state"
_NAME = "deepspeed"


class ShardpointCheckpointEngine(CheckpointEngine):
    """A DeepSpeed ``CheckpointEngine`` writing each file DeepSpeed names as a directory holding
    one shardpoint checkpoint (``state.index`` + ``state.data-*``).

    Args:
        config_params: DeepSpeed's config (unused; DeepSpeed's engines take it).
        blocking: ``False`` returns from ``save`` once the state is snapshotted and makes the
            engine *decoupled* in DeepSpeed's sense: ``save_checkpoint`` returns without
            committing, and DeepSpeed commits at the next optimizer step (or when the engine is
            destroyed), calling ``commit``, which waits for every write, before it writes the
            ``latest`` file: ``latest`` never names a checkpoint that is not complete. The
            writes overlap the next step's forward and backward passes.
        compression, level: as :func:`shardpoint.torch.save`.
    """

    def __init__(
        self,
        config_params: Any = None,
        *,
        blocking: bool = True,
        compression: str | None = "zstd",
        level: int | None = None,
    ) -> None:
        super().__init__(config_params)
        self.name = "ShardpointCheckpointEngine"
        self.blocking = blocking
        self.compression = compression
        self.level = level
        self._pending = PendingSaves()
        self._engine: weakref.ref[Any] | None = None
        self._load_args: dict[str, Any] | None = None
        self._loaded: dict[str, Any] | None = None  # path -> state, during load_checkpoint
        self._commit_info: Any = None  # the checkpoint a decoupled commit is due for

    def create(self, info: Any) -> None:
        """Start of a checkpoint (DeepSpeed's ``CheckpointCommitInfo``): remembered for the
        decoupled commit (``blocking=False``)."""
        if not self.blocking:
            self._commit_info = info

    def is_decoupled(self) -> bool:
        """Whether DeepSpeed commits later (``blocking=False``): at its next optimizer step."""
        return not self.blocking

    def get_commit_info(self) -> Any:
        """The checkpoint awaiting its decoupled commit, or None."""
        return self._commit_info

    def save(self, state_dict: Any, path: str) -> None:
        """Write ``state_dict`` as directory ``path``."""
        directory = os.fspath(path)
        self._pending.wait(directory)
        fut = save_tree(
            encode_objects(state_dict),
            part_prefix(directory, _PART),
            integration=_NAME,
            blocking=self.blocking,
            compression=self.compression,
            level=self.level,
        )
        if fut is not None:
            self._pending.add(directory, fut)

    def attach(self, engine: Any) -> None:
        """Learn which engine loads through us (``use_shardpoint`` calls this): its
        ``load_checkpoint`` is wrapped to record its arguments for the duration of each call,
        so :meth:`load` knows which existing tensors will receive which values."""
        self._engine = weakref.ref(engine)
        wrap_load_checkpoint(engine, self, _record_load_args)

    def _targets(self, name: str) -> dict[str, Any] | None:
        """The engine's live tensors that the file ``name`` is about to restore, nested as
        DeepSpeed saved it (``load_tree``'s ``into``), or None outside ``load_checkpoint``.

        Only where DeepSpeed writes the stored value into that very tensor whatever it does
        in between: the module's parameters unless a ``custom_load_fn`` decides; the
        optimizer's state and fp32 partitions unless ``load_optimizer_states=False`` or
        ``load_module_only=True`` keep the current ones."""
        engine = self._engine() if self._engine is not None else None
        args = self._load_args
        if engine is None or args is None:
            return None
        into: dict[str, Any] = {}
        model_file = name.endswith("model_states.pt")
        universal = bool(getattr(engine, "load_universal_checkpoint", lambda: False)())
        if model_file and args.get("custom_load_fn") is None and not universal:
            into["module"] = module_targets(engine.module)
        opt = engine.optimizer
        if (
            opt is not None
            and args.get("load_optimizer_states", True)
            and not args.get("load_module_only", False)
        ):
            zero = bool(engine.zero_optimization())
            if zero and "optim_states" in name:
                into["optimizer_state_dict"] = encode_objects(opt.state_dict())
            elif model_file and not zero:
                into["optimizer"] = encode_objects(opt.state_dict())
        return into

    def load(self, path: str, map_location: Any = None) -> Any:
        """The state saved as ``path`` (tensors on the CPU, where DeepSpeed maps them too);
        inside ``engine.load_checkpoint``, values go straight into the tensors that DeepSpeed
        restores from them (:meth:`attach`)."""
        directory = os.fspath(path)
        self._pending.wait(directory)
        cache = self._loaded
        if cache is not None and directory in cache:
            # DeepSpeed reads mp_rank_*_model_states twice per load_checkpoint (once to check
            # mp_world_size, then to restore): decoded once, every reader gets its own dicts
            return _fresh_containers(cache[directory])
        into = self._targets(os.path.basename(directory.rstrip(os.sep)))
        tree = decode_objects(
            load_tree(part_prefix(directory, _PART), integration=_NAME, into=into)
        )
        if cache is not None:
            cache[directory] = tree
            return _fresh_containers(tree)
        return tree

    def commit(self, info: Any) -> bool:
        """Wait until every file of the checkpoint is committed (re-raises a failed write)."""
        self._pending.wait()
        self._commit_info = None
        return True

    def wait(self) -> None:
        """Block until every background write has committed."""
        self._pending.wait()

    def cleanup(self) -> None:
        """DeepSpeed's end of the engine: every write finishes (a decoupled checkpoint is
        committed; ``latest`` moves only at a step, as with DeepSpeed's own decoupled engine)."""
        self._pending.wait()
        self._commit_info = None

    def preserves_storage_sharing(self) -> bool:
        # tensors that share storage are stored once and come back sharing it
        return True


def _fresh_containers(tree: Any) -> Any:
    """``tree`` with new dicts, lists and tuples (leaves shared): a caller editing its state
    (DeepSpeed replaces entries) does not edit another caller's."""
    if isinstance(tree, dict):
        return {k: _fresh_containers(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_fresh_containers(v) for v in tree]
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return tuple(_fresh_containers(v) for v in tree)
    return tree


def wrap_load_checkpoint(
    engine: Any, owner: Any, around: Callable[[Any, Any, inspect.BoundArguments, tuple, dict], Any]
) -> None:
    """Replace ``engine.load_checkpoint`` by a wrapper that calls ``around(owner, load, bound,
    args, kwargs)`` (``load`` the original method, ``bound`` its arguments) while ``owner``
    lives, and the original once it is gone. Wrapping again wraps the original, not a wrapper."""
    load = engine.__dict__.get("_sp_load_checkpoint") or engine.load_checkpoint
    signature = inspect.signature(load)
    me = weakref.ref(owner)

    @functools.wraps(load)
    def load_checkpoint(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        o = me()
        if o is None:
            return load(*args, **kwargs)
        return around(o, load, bound, args, kwargs)

    engine._sp_load_checkpoint = load
    engine.load_checkpoint = load_checkpoint


def _record_load_args(
    ckpt: Any, load: Any, bound: inspect.BoundArguments, args: tuple, kwargs: dict
) -> Any:
    """Record the call's arguments for the duration of the load (see ``attach``)."""
    bound.apply_defaults()
    ckpt._load_args, ckpt._loaded = dict(bound.arguments), {}
    try:
        return load(*args, **kwargs)
    finally:
        ckpt._load_args = ckpt._loaded = None
