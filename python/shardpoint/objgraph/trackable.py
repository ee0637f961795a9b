"""The trackable protocol: objects that name their children and their saveable values.

An object takes part in an object-based checkpoint when it is a :class:`Trackable`. The protocol
is a handful of ``_sp_*`` methods (prefixed so they never collide with user attributes):

``_sp_children()``
    ordered mapping ``local name -> Trackable``: the named edges of the object graph. Order
    matters: breadth-first naming gives an object the first path found, and among paths of equal
    length the dependency inserted first wins.
``_sp_lookup(name)``
    the live child called ``name`` or ``None`` (restore matches checkpoint edges by name).
``_sp_values()``
    ``attribute name -> value`` to save (numpy arrays, numpy scalars, str, bytes, int, float,
    bool, None, JSON-able dict/list). A Variable has the single attribute ``VARIABLE_VALUE``.
``_sp_value_specs()``
    ``attribute name -> ValueSpec | None``: which attributes the object can restore, and the
    shape/dtype each must have (checked *before* the value is read: no silent casts).
``_sp_restore_values(values)``
    receives the checked values (numpy arrays read lazily from disk) and writes them into the
    object's own storage, in place where it can (foreign adapters copy into torch tensors here).

Optimizers that own per-variable slot variables also implement the slot protocol
(:class:`~shardpoint.objgraph.variables.SlotProvider`, next to the variables it creates,
gives a ready-made implementation).

Foreign objects (torch modules, optimizers, tensors) become trackable through adapters:
:func:`register_trackable_adapter` maps a class or predicate to a factory that wraps the object
in a Trackable. The framework adapters shipped with shardpoint sit in a lower tier
(:func:`register_builtin_adapter`) and are imported before the first lookup once their framework
is imported (:func:`declare_adapter_module`). Objects with ``state_dict()``/``load_state_dict()``
and no other adapter get the generic fallback adapter.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .errors import DuplicateDependencyError, NotTrackableError
from .restore_order import PendingRestore, newest_first

__all__ = [
    "Trackable",
    "ValueSpec",
    "NoDependency",
    "register_trackable_adapter",
    "unregister_trackable_adapter",
    "as_trackable",
    "declare_adapter_module",
    "register_builtin_adapter",
    "register_fallback_adapter",
]


class ValueSpec(NamedTuple):
    """Shape and dtype name (numpy spelling: ``float32``, ``bfloat16``, ``int64``…) of a value."""

    shape: tuple[int, ...]
    dtype: str


class _TrackState:
    """Per-object bookkeeping, created lazily so subclasses need not call ``__init__``."""

    __slots__ = ("deps", "deferred", "restore_uid")

    def __init__(self) -> None:
        self.deps: dict[str, Trackable] = {}
        # name -> checkpoint positions waiting for a dependency of that name to be attached
        self.deferred: dict[str, list[PendingRestore]] = {}
        # uid of the newest restore() whose values this object holds; older ones never overwrite
        self.restore_uid: int = 0


class Trackable:
    """Base class of everything that can be saved in an object-based checkpoint.

    Subclasses override the ``_sp_*`` protocol methods they need; the defaults describe an
    object with explicitly tracked children (see :meth:`_sp_track`) and no values.
    """

    # When True, every attribute the checkpoint holds for this object's node is handed to
    # _sp_restore_values, not only those named by _sp_value_specs (state-dict adapters use this:
    # a fresh torch optimizer has no state yet but must accept the saved one).
    _sp_open_attributes: bool = False

    # -- bookkeeping -----------------------------------------------------------------------
    def _sp_state(self) -> _TrackState:
        try:
            return self.__dict__["_sp_st"]
        except KeyError:
            st = _TrackState()
            object.__setattr__(self, "_sp_st", st)
            return st

    # -- graph protocol --------------------------------------------------------------------
    def _sp_children(self) -> Mapping[str, Trackable]:
        """Ordered ``name -> Trackable`` of this object's dependencies."""
        return dict(self._sp_state().deps)

    def _sp_lookup(self, name: str) -> Trackable | None:
        """The dependency called ``name``, or None."""
        return self._sp_state().deps.get(name)

    def _sp_values(self) -> Mapping[str, Any]:
        """``attribute -> value`` to write; empty for pure containers."""
        return {}

    def _sp_value_specs(self) -> Mapping[str, ValueSpec | None]:
        """``attribute -> spec`` this object can restore (``None`` = no shape/dtype check)."""
        return {}

    def _sp_restore_values(self, values: Mapping[str, Any]) -> None:
        """Write restored, already checked values into this object."""

    def _sp_value_targets(self) -> Mapping[str, Any]:
        """``attribute -> numpy array`` that a restore may decode the checked value straight
        into (C-contiguous, writable, the value's dtype and shape: the object's own memory);
        such values are not passed to :meth:`_sp_restore_values`. Empty by default."""
        return {}

    def _sp_check_saveable(self) -> None:
        """Raise UnsaveableObjectError if the object cannot be saved now (called at save)."""

    # -- dependency management -------------------------------------------------------------
    def _sp_track(self, name: str, value: Any, *, overwrite: bool = False) -> Trackable:
        """Declare ``value`` a dependency named ``name`` and run pending restores for it.

        Raises NotTrackableError for non-trackables (TRK-07) and DuplicateDependencyError when
        the name is taken by another object and ``overwrite`` is False (TRK-08).
        """
        tracked = as_trackable(value)
        if tracked is None:
            raise NotTrackableError(
                "Trackable._sp_track() can only be used to track trackable objects (Trackable "
                f"subclasses or objects with a registered adapter). Got type {type(value)}."
            )
        deps = self._sp_state().deps
        current = deps.get(name)
        if current is tracked:
            return tracked  # re-assigning the identical object is a no-op (TRK-01)
        if current is not None and not overwrite:
            raise DuplicateDependencyError(
                f"Called _sp_track() with name={name!r}, but a trackable with this name is "
                "already declared as a dependency. Names must be unique (or overwrite=True)."
            )
        if current is not None:
            del deps[name]  # an overwrite moves the edge to the end, like a fresh insertion
        deps[name] = tracked
        self._sp_handle_deferred(name, tracked)
        return tracked

    def _sp_untrack(self, name: str) -> None:
        """Remove the dependency called ``name`` (no error if absent)."""
        self._sp_state().deps.pop(name, None)

    # -- deferred restore (the ordering rule lives in restore_order) --------------------------
    def _sp_deferral_host(self, name: str) -> Trackable:
        """The object where a restore waiting for a missing dependency ``name`` is parked: it
        must be the object that will see ``name`` attached. Itself by default; a
        ``Checkpoint`` answers with its root object (``Checkpoint(root=net)`` then
        ``net.x = ...``)."""
        return self

    def _sp_defer(self, name: str, position: PendingRestore) -> None:
        """Park a checkpoint position until a dependency called ``name`` is attached."""
        host = self._sp_deferral_host(name)
        if host is not self:
            host._sp_defer(name, position)
            return
        self._sp_state().deferred.setdefault(name, []).append(position)

    def _sp_pending(self, name: str) -> list[PendingRestore]:
        """Positions waiting for ``name``, newest restore first (used by restore-on-create)."""
        return newest_first(self._sp_state().deferred.get(name, ()))

    def _sp_handle_deferred(self, name: str, child: Trackable) -> None:
        """Restore ``child`` (and its subtree) from every restore waiting on ``name``,
        newest first (:mod:`~shardpoint.objgraph.restore_order`: the restore called last
        wins whatever order objects are attached in)."""
        deferred = self._sp_state().deferred
        positions = deferred.pop(name, None)
        if positions is None:
            alias = private_alias(name)
            if alias is not None:
                positions = deferred.pop(alias, None)
        for position in newest_first(positions or ()):
            position.bind_and_restore(child)


def private_alias(name: str) -> str | None:
    """The other spelling of a Keras 3 weight name: Keras 3 keeps a layer's weight in a private
    attribute behind a public property (``Dense._kernel`` behind ``kernel``), so TensorFlow and
    shardpoint save ``l1/_kernel`` where the TF guide's stand-in objects attach ``kernel``.
    A restore waiting for ``_kernel`` is satisfied by a dependency attached as ``kernel`` (and
    the reverse) when nothing waits for the exact name; None for names without such a twin."""
    if not name or name.isdigit():
        return None
    if name.startswith("_"):
        rest = name[1:]
        return rest if rest and not rest.startswith("_") else None
    return "_" + name


class NoDependency:
    """Wrap a value to assign it to a Module attribute without tracking it (TRK-05)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"NoDependency({self.value!r})"


# --------------------------------------------------------------------------------------------
# Adapters for foreign objects
# --------------------------------------------------------------------------------------------

AdapterFactory = Callable[[Any], Trackable]
_Registry = list[tuple[Callable[[Any], bool], AdapterFactory]]
# Three tiers, tried in this order (within a tier, newest registration first):
# the user's adapters (register_trackable_adapter), the built-in framework adapters
# (register_builtin_adapter: shardpoint.torch), then generic protocols such as
# state_dict()/load_state_dict() (register_fallback_adapter). Tiers, not registration order,
# decide precedence, so a user's adapter wins whether shardpoint.torch was imported before or
# after it was registered.
_ADAPTERS: _Registry = []
_BUILTIN_ADAPTERS: _Registry = []
_FALLBACK_ADAPTERS: _Registry = []
# id(value) -> (weakref to value, weakref to adapter). Both weak: the adapter lives exactly as
# long as something (a Module dependency) holds it, so the same foreign object seen twice maps to
# the same adapter (shared objects are stored once) without keeping anything alive.
_ADAPTER_CACHE: dict[int, tuple[Any, Any]] = {}


def _as_predicate(cls_or_predicate: type | tuple[type, ...] | Callable[[Any], bool]) -> Any:
    if isinstance(cls_or_predicate, type | tuple):
        classes = cls_or_predicate

        def is_instance(obj: Any) -> bool:
            return isinstance(obj, classes)

        return is_instance
    if callable(cls_or_predicate):
        return cls_or_predicate
    raise TypeError("cls_or_predicate must be a class, a tuple of classes or a callable")


def register_trackable_adapter(
    cls_or_predicate: type | tuple[type, ...] | Callable[[Any], bool],
    factory: AdapterFactory,
) -> None:
    """Make foreign objects trackable.

    ``cls_or_predicate`` is a class (or tuple of classes, matched with ``isinstance``) or a
    predicate ``obj -> bool``; ``factory(obj)`` returns a :class:`Trackable` adapter that names the
    object's children and values and restores values in place into the object's own storage.
    Adapters registered with this function take precedence over the built-in ones (the torch
    adapters of ``shardpoint.torch``), whatever the import order, and among themselves the one
    registered later wins. Used when a foreign object is assigned to a
    :class:`~shardpoint.objgraph.module.Module` attribute, put in a tracked list/dict, or passed to
    ``Checkpoint(...)``; the attribute keeps the foreign object, the graph edge points at the
    adapter. The same live object always gets the same adapter while it is tracked.
    """
    _ADAPTERS.append((_as_predicate(cls_or_predicate), factory))


def register_builtin_adapter(
    cls_or_predicate: type | tuple[type, ...] | Callable[[Any], bool],
    factory: AdapterFactory,
) -> None:
    """Register one of shardpoint's own framework adapters: tried after every adapter of
    :func:`register_trackable_adapter` and before the fallbacks (later registration wins
    within the tier)."""
    _BUILTIN_ADAPTERS.append((_as_predicate(cls_or_predicate), factory))


def register_fallback_adapter(predicate: Callable[[Any], bool], factory: AdapterFactory) -> None:
    """Like :func:`register_trackable_adapter`, but tried only after every regular and
    built-in adapter (for generic protocols: a specific adapter of the same object always
    wins)."""
    _FALLBACK_ADAPTERS.append((predicate, factory))


def unregister_trackable_adapter(factory: AdapterFactory) -> None:
    """Remove every registration of ``factory`` (mainly for tests)."""
    for registry in (_ADAPTERS, _BUILTIN_ADAPTERS, _FALLBACK_ADAPTERS):
        registry[:] = [(p, f) for p, f in registry if f is not factory]
    _ADAPTER_CACHE.clear()


def _cache_get(value: Any) -> Trackable | None:
    entry = _ADAPTER_CACHE.get(id(value))
    if entry is None:
        return None
    value_ref, adapter_ref = entry
    if value_ref() is value:
        adapter = adapter_ref()
        if adapter is not None:
            return adapter
    del _ADAPTER_CACHE[id(value)]
    return None


def _cache_put(value: Any, adapter: Trackable) -> None:
    try:
        value_ref = weakref.ref(value)
        adapter_ref = weakref.ref(adapter)
    except TypeError:
        return  # not weak-referenceable: no sharing detection for this object
    key = id(value)
    _ADAPTER_CACHE[key] = (value_ref, adapter_ref)
    weakref.finalize(adapter, _ADAPTER_CACHE.pop, key, None)


def as_trackable(value: Any) -> Trackable | None:
    """``value`` itself if it is Trackable, else its adapter, else None.

    Before any lookup, the adapter module of every framework named in
    :func:`declare_adapter_module` that the process has imported is imported (once), so the
    answer does not depend on what the user imported or in which order. Then the user's
    adapters are tried (newest registration first), the built-in ones, and the fallbacks (the
    ``state_dict()`` adapter).
    """
    if isinstance(value, Trackable):
        return value
    if _ADAPTER_MODULES:
        _import_declared_adapters()
    if _FAILED:
        _refuse_without_adapters(value)
    cached = _cache_get(value)
    if cached is not None:
        return cached
    for registry in (_ADAPTERS, _BUILTIN_ADAPTERS, _FALLBACK_ADAPTERS):
        adapter = _adapt(value, registry)
        if adapter is not None:
            return adapter
    return None


def _adapt(value: Any, registry: _Registry) -> Trackable | None:
    for predicate, factory in reversed(registry):
        if predicate(value):
            adapter = factory(value)
            if not isinstance(adapter, Trackable):
                raise TypeError(f"adapter factory {factory!r} returned a non-Trackable {adapter!r}")
            _cache_put(value, adapter)
            return adapter
    return None


# Foreign package name -> the shardpoint module whose import registers its adapters. Filled by
# the package that knows both sides (``shardpoint/__init__``); this layer never names a
# framework itself.
_ADAPTER_MODULES: dict[str, str] = {}


def declare_adapter_module(foreign_package: str, adapter_module: str) -> None:
    """Import ``adapter_module`` before the first adapter lookup made while ``foreign_package``
    is imported in this process.

    Why "imported" and not "the object's class comes from that package": an object whose
    class, or any class of its MRO, is defined in ``torch`` (a user's ``nn.Module`` subclass
    defined in ``__main__``, a custom optimizer or LR scheduler) can only exist once torch is
    imported, so this rule gives every such object its torch adapter whatever was imported in
    whatever order, and the generic ``state_dict()`` fallback never claims a torch object.
    ``import shardpoint`` alone never imports the framework.
    """
    _ADAPTER_MODULES[foreign_package] = adapter_module


def _import_declared_adapters() -> None:
    """Import the adapter module of each declared package that is imported now, once.

    The declaration is removed only once its module imported: another thread looking an
    object up meanwhile waits on the lock instead of seeing no declaration and falling back to
    the generic adapter before the framework's adapters are registered. A lookup made by the
    importing thread itself, while the module imports, skips it (no recursion). An import that
    fails is remembered: objects of that framework then raise (never a silent fallback to the
    generic adapter), everything else is still tracked."""
    with _IMPORT_LOCK:
        for package, module in list(_ADAPTER_MODULES.items()):
            if package in _IMPORTING or sys.modules.get(package) is None:
                continue  # None in sys.modules: an import blocked on purpose
            _IMPORTING.add(package)
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - reported for the framework's objects
                _FAILED[package] = (module, exc)
            finally:
                _IMPORTING.discard(package)
            _ADAPTER_MODULES.pop(package, None)


def _refuse_without_adapters(value: Any) -> None:
    """Raise for an object whose class or a base comes from a framework whose adapter module
    failed to import."""
    for cls in type(value).__mro__:
        root = cls.__module__.split(".", 1)[0]
        failed = _FAILED.get(root)
        if failed is not None:
            module, exc = failed
            raise ImportError(
                f"{type(value).__name__} is a {root} object, but {module} (its trackable "
                f"adapters) failed to import: {exc}. It is not tracked with a generic adapter, "
                "which would save less than it holds."
            ) from exc


_IMPORT_LOCK = threading.RLock()
_IMPORTING: set[str] = set()


def _reset_in_child() -> None:
    # A forked child has only the forking thread: an import another thread was running (and
    # its lock) never finishes there (ARCHITECTURE.md, "Threads and fork").
    global _IMPORT_LOCK
    _IMPORT_LOCK = threading.RLock()
    _IMPORTING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
# package -> (adapter module, the error its import raised)
_FAILED: dict[str, tuple[str, BaseException]] = {}
