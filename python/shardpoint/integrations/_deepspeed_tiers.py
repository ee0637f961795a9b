"""DeepSpeed's checkpoints in the tiers: ``use_shardpoint(engine, local_directory=...)``.

A DeepSpeed checkpoint is files, each written by one rank: every rank its ZeRO optimizer
partition (``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``), data-parallel rank 0 the model
states (``mp_rank_00_model_states.pt``) that every rank reads back. The tiers keep one part
per rank, so a rank's part here is *the files it wrote* (``{"tag": ..., "files": {name:
state}}``), stored by :class:`shardpoint.TieredCheckpointManager` as step
``engine.global_steps`` at each ``save_checkpoint`` (its replicas on peers, the persistent tier
every ``persistent_every`` steps, in the background).

``load_checkpoint`` then restores the newest step complete in any tier (each rank its own
part, from the cheapest tier), and a rank that reads a file another rank wrote gets it from
that rank: the ranks all-gather the names of their files, each works out which files its
DeepSpeed will read (DeepSpeed's own name functions: its model-states file, its ZeRO
partition, every partition under ``elastic_checkpoint``), and asks the ranks holding them for
their parts (``manager.fetch_restored``: sent from the owner's local tier, every file checked
against the crc32c recorded when it was saved). DeepSpeed's own ``load_checkpoint`` then runs
over a directory of empty entries named like the files (its discovery globs and tests names),
each read served from memory by this engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from ..errors import InvalidArgumentError, TierError
from ._deepspeed_engine import _fresh_containers, wrap_load_checkpoint
from ._deepspeed_objects import decode_objects, encode_objects
from ._state import load_tree
from ._tier_state import TreeState, tier_options

__all__ = ["ShardpointTierEngine"]

_NAME = "deepspeed-tiers"


class ShardpointTierEngine(CheckpointEngine):
    """A DeepSpeed ``CheckpointEngine`` keeping each rank's checkpoint files in the tiers
    (:func:`shardpoint.integrations.deepspeed.use_shardpoint` with ``local_directory``).

    ``engine.save_checkpoint(dir)``: every call is a local-tier save of step
    ``engine.global_steps`` (DeepSpeed's callers choose when to save, so ``local_every`` is
    not taken); the persistent tier (``tiers["directory"]``, default ``dir``) gets the steps
    that are multiples of ``persistent_every``. ``engine.load_checkpoint(dir)`` (no ``tag``)
    restores the newest step complete in any tier, or returns ``(None, None)`` when none is.
    :attr:`restored_step` and :attr:`restore_plan` say what was restored and from where."""

    def __init__(self, engine: Any, local_directory: Any, tiers: Any = None) -> None:
        super().__init__(getattr(engine, "_config", None))
        self.name = "ShardpointTierEngine"
        options = tier_options("use_shardpoint tiers", tiers)
        if "local_every" in options:
            raise InvalidArgumentError(
                "use_shardpoint tiers: local_every is not taken: every "
                "engine.save_checkpoint call is a local-tier save"
            )
        self.local_directory = os.fspath(local_directory)
        self.options = options
        self.manager: Any = None
        #: the step the last ``load_checkpoint`` restored (None: none yet, or nothing complete)
        self.restored_step: int | None = None
        #: where each rank's part came from (``shardpoint.tiers.RestorePlan``)
        self.restore_plan: Any = None
        #: the files the last restore read from other ranks' parts: name -> that rank
        self.fetched_from: dict[str, int] = {}
        self._engine = weakref.ref(engine)
        self._state = TreeState(self._tree, _NAME)
        self._info: Any = None  # the save in progress (DeepSpeed's CheckpointCommitInfo)
        self._files: dict[str, Any] = {}  # its files: name -> state
        self._saving: dict[str, Any] | None = None  # the tree the manager's write captures
        self._loading: dict[str, Any] | None = None  # path -> state, during load_checkpoint
        self._elsewhere: set[str] = set()  # paths another rank wrote and this one did not fetch

    # -- the manager -----------------------------------------------------------------------------
    def open(self, directory: str) -> Any:
        """The tiered manager (built on first use, a collective: every rank saves or loads)."""
        opts = dict(self.options)
        persistent = opts.pop("directory", None) or os.fspath(directory)
        if self.manager is None:
            from ..tiers import TieredCheckpointManager

            self.manager = TieredCheckpointManager(
                self._state, persistent, local_directory=self.local_directory, **opts
            )
        elif _where(self.manager.directory) != _where(persistent):
            raise InvalidArgumentError(
                f"{directory}: this engine's tiers keep their persistent copies in "
                f"{self.manager.directory}; save and load with that directory (or set "
                "tiers={'directory': ...})"
            )
        return self.manager

    def wait(self) -> None:
        """Block until every save committed in the local tier (replicas included) and every
        due upload in the persistent tier; raise a failed one's error."""
        if self.manager is not None:
            self.manager.wait()

    def close(self) -> None:
        """Wait for the saves in flight, then stop the tiers' threads."""
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.close()

    def cleanup(self) -> None:
        self.wait()

    # -- saving ----------------------------------------------------------------------------------
    def create(self, info: Any) -> None:
        """Start of ``save_checkpoint`` (every rank): the manager opened, the files collected."""
        from .. import storage

        if storage.is_url(str(info.save_dir)):
            raise InvalidArgumentError(
                f"save_checkpoint({info.save_dir!r}): DeepSpeed writes its `latest` file into "
                "that directory, so it must be a local path; put the persistent tier in the "
                "object store with use_shardpoint(..., tiers={'directory': URL})"
            )
        self.open(info.save_dir)
        self._info, self._files = info, {}

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        # the save directory itself is made (DeepSpeed writes its ``latest`` file there); the
        # tag's directory would only be an empty folder: the files go to the tiers
        from .. import storage

        info = self._info
        if storage.is_url(path):
            return  # refused by create, which every rank reaches (only rank 0 gets here)
        if info is not None:
            folder = os.path.abspath(os.path.join(info.save_dir, str(info.tag)))
            target = os.path.abspath(path)
            if target == folder or target.startswith(folder + os.sep):
                return
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        info = self._info
        where = os.path.abspath(os.path.join(info.save_dir, str(info.tag))) if info else None
        if where is None or os.path.dirname(os.path.abspath(path)) != where:
            raise InvalidArgumentError(
                f"{path}: the tiers store the files of a save_checkpoint call in its tag's "
                f"directory ({where}), not elsewhere"
            )
        self._files[os.path.basename(path)] = encode_objects(state_dict)

    def commit(self, info: Any) -> bool:
        """The collected files saved as this rank's part of step ``engine.global_steps``:
        returns once they are copied into host memory; written, replicated and agreed in the
        background (an earlier save's failure raises here)."""
        engine = self._engine()
        if engine is None or self.manager is None:
            raise TierError("the DeepSpeed engine of these tiers is gone")
        self._saving = {"tag": str(info.tag), "files": self._files}
        try:
            self.manager.save(int(engine.global_steps), force=True)
        finally:
            self._saving, self._info, self._files = None, None, {}
        return True

    def _tree(self) -> dict[str, Any]:
        if self._saving is None:
            raise TierError("a tier save outside save_checkpoint")
        return self._saving

    # -- loading ---------------------------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        """Route ``engine.load_checkpoint`` through :meth:`restore`."""
        wrap_load_checkpoint(
            engine, self, lambda me, load, bound, _a, _k: me.restore(load, dict(bound.arguments))
        )

    def restore(self, load: Any, args: dict[str, Any]) -> Any:
        """``engine.load_checkpoint(**args)`` from the tiers (a collective)."""
        if args.get("tag") is not None:
            raise InvalidArgumentError(
                f"load_checkpoint(tag={args['tag']!r}): with the tiers, load_checkpoint "
                "restores the newest step complete in any tier (pass no tag)"
            )
        engine = self._engine()
        assert engine is not None
        if bool(getattr(engine, "load_universal_checkpoint", lambda: False)()):
            raise InvalidArgumentError("the tiers do not restore universal checkpoints")
        manager = self.open(args["load_dir"])
        self.fetched_from = {}
        step = manager.restore_or_initialize()
        self.restored_step, self.restore_plan = step, manager.restore_plan()
        tree, self._state.loaded = self._state.loaded, None
        if step is None or tree is None:
            return None, None
        tag, files = str(tree["tag"]), dict(tree["files"])
        names = [set(n) for n in manager.all_gather(sorted(files))]
        view = tempfile.mkdtemp(prefix="shardpoint-deepspeed-tiers-")
        try:
            failed: Exception | None = None
            try:
                needed = _needed(engine, view, tag, set().union(*names))
            except Exception as e:  # raised after the fetch, which the other ranks wait in
                failed, needed = e, set()
            owners = sorted(
                o
                for o, held in enumerate(names)
                if (needed - set(files)) & held and o != manager.rank
            )
            try:
                fetched = manager.fetch_restored(owners)
                if failed is not None:
                    raise failed
                for owner, prefix in fetched.items():
                    # every value's crc32c checked again as it is decoded; the other files of
                    # that rank's part are decoded too: a part is read whole
                    other = load_tree(prefix, integration=_NAME)["files"]
                    for n in sorted(needed & set(other) - set(files)):
                        files[n] = other[n]
                        self.fetched_from[n] = owner
            finally:
                manager.drop_fetched()
            folder = os.path.join(view, tag)
            for name in set().union(*names):
                # DeepSpeed finds its files by globbing and testing names: empty entries
                os.makedirs(os.path.join(folder, name))
            self._loading = {os.path.join(folder, n): decode_objects(v) for n, v in files.items()}
            self._elsewhere = {os.path.join(folder, n) for n in set().union(*names)} - set(
                self._loading
            )
            del files, tree
            args = {**args, "load_dir": view, "tag": tag}
            return load(**args)
        finally:
            self._loading, self._elsewhere = None, set()
            shutil.rmtree(view, ignore_errors=True)

    def load(self, path: str, map_location: Any = None) -> Any:
        """A file of the checkpoint ``load_checkpoint`` is restoring (tensors on the CPU)."""
        key = os.fspath(path)
        if self._loading is None:
            raise InvalidArgumentError(
                f"{key}: with the tiers, DeepSpeed's files are read only inside "
                "engine.load_checkpoint"
            )
        if key in self._loading:
            # DeepSpeed reads its model-states file twice: every reader gets its own dicts
            return _fresh_containers(self._loading[key])
        if key in self._elsewhere:
            raise TierError(
                f"{os.path.basename(key)}: written by another rank and not fetched by this "
                "one (a read the tiers did not foresee)"
            )
        raise TierError(f"{os.path.basename(key)}: no rank's part of the restored step holds it")


def _where(directory: str) -> str:
    from .. import storage

    return directory.rstrip("/") if storage.is_url(directory) else os.path.abspath(directory)


def _needed(engine: Any, view: str, tag: str, names: set[str]) -> set[str]:
    """The files ``engine.load_checkpoint(view, tag)`` reads on this rank, named by
    DeepSpeed's own functions: its model-states file and, under ZeRO, its optimizer partition
    (both bit16 spellings), or every partition when DeepSpeed reads them all (elastic)."""
    wanted = {os.path.basename(engine._get_ckpt_name(view, tag))}
    if engine.zero_optimization():
        if engine.zero_elastic_checkpoint():
            wanted |= {n for n in names if n.endswith("optim_states.pt")}
        else:
            import deepspeed.comm as dist

            dp_rank = dist.get_rank(group=engine.optimizer.dp_process_group)
            for bf16 in (True, False):
                path = engine._get_rank_zero_ckpt_name(
                    view, tag, engine.checkpoint_mp_rank, dp_rank, bf16
                )
                wanted.add(os.path.basename(path))
    return wanted
