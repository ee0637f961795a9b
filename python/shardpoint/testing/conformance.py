"""Conformance suites: pytest base classes you subclass to test your adapter or storage.

* :class:`AdapterTests` — set ``dtypes`` and implement ``to_native(np_array)`` /
  ``from_native(x)`` (and ``save``/``load`` when your framework has its own): the suite proves
  that every dtype and shape, every code of the narrow dtypes (all 256 float8 and packed float4
  codes, all 65536 float16/bfloat16 codes) and the special codes of the wide ones (NaN payloads
  and signs, -0.0, subnormals, infinities) round-trip bit for bit, from contiguous and strided
  inputs.
* :class:`StorageTests` — implement ``location()`` (a fresh directory or object-store URL):
  round trips, ranged reads, atomic visibility to open readers, listing, deletion, concurrent
  and multi-writer saves, and a run of ``CheckpointManagerMachine`` on that storage.

The cases are fixed, not drawn (the same checks on every run), so the suites need pytest but
not Hypothesis, except ``StorageTests.test_manager_state_machine``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import storage
from ..errors import CheckpointIOError, NotFoundError, UnsupportedDTypeError
from ..storage.dtypes import numpy_dtype
from ._bits import NAMES, element_bits, special_codes, uint_dtype
from ._frameworks import name_of
from .assertions import assert_identical, check
from .roundtrip import assert_roundtrip

__all__ = ["AdapterTests", "StorageTests", "code_sample"]


def code_sample(name: str, *, random: int = 512, seed: int = 0) -> np.ndarray:
    """A 1-d array of dtype ``name`` holding every code of one- and two-byte dtypes, and the
    special codes (each pairing of them for complex) plus ``random`` seeded random codes of
    the wider ones."""
    dtype = numpy_dtype(name)
    if name == "bool":
        return np.array([False, True])
    bits = element_bits(name)
    if bits <= 16:
        codes = np.arange(1 << bits, dtype=uint_dtype(bits))
        return codes.view(dtype)
    rng = np.random.default_rng(seed)
    special = special_codes(name)
    if name.startswith("complex"):
        half = bits // 2
        pairs = [(r, i) for r in special for i in special]
        lo = np.array([p[0] for p in pairs], dtype=np.uint64)
        hi = np.array([p[1] for p in pairs], dtype=np.uint64)
        rand = rng.integers(0, 1 << half, size=(random, 2), dtype=np.uint64, endpoint=False)
        lo = np.concatenate([lo, rand[:, 0]])
        hi = np.concatenate([hi, rand[:, 1]])
        if half == 32:
            packed = (lo | (hi << np.uint64(32))).astype("<u8")
            return packed.view(dtype)
        return np.stack([lo, hi], axis=-1).astype("<u8").reshape(-1).view(dtype)
    u = uint_dtype(bits)
    rand = rng.integers(0, np.iinfo(u).max, size=random, dtype=u, endpoint=True)
    return (
        np.concatenate([np.array(special, dtype=u), rand]).astype(u.newbyteorder("<")).view(dtype)
    )


def _shaped(sample: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    reps = -(-n // max(1, sample.size)) if n else 0
    flat = np.concatenate([sample] * reps)[:n] if n else sample[:0]
    return flat.copy().reshape(shape)  # (np.ascontiguousarray would make 0-d arrays 1-d)


class AdapterTests:
    """Base class for a framework adapter's conformance tests (subclass as ``Test...``).

    Set ``dtypes`` (format names such as ``"bfloat16"`` or dtype objects: the ones your
    adapter stores), implement ``to_native`` and ``from_native`` (exact: no numeric
    conversion), and override ``save``/``load`` when your framework saves through its own
    shardpoint entry point (default: ``sp.save_file`` / ``sp.load_file`` of a dict of native
    tensors). ``shapes`` lists the shapes tried for every dtype.
    """

    dtypes: Sequence[Any] = ()
    shapes: Sequence[tuple[int, ...]] = ((), (0,), (1,), (7,), (2, 3), (3, 0, 2), (2, 3, 4))
    #: whether ``to_native`` keeps a strided numpy view strided (then those inputs are tried)
    strided_inputs: bool = True

    def to_native(self, array: np.ndarray) -> Any:
        """Your framework's tensor holding ``array``'s bits."""
        raise NotImplementedError("AdapterTests: implement to_native(np_array)")

    def from_native(self, x: Any) -> np.ndarray:
        """A numpy array holding ``x``'s bits (bfloat16/float8 as their ml_dtypes types)."""
        raise NotImplementedError("AdapterTests: implement from_native(x)")

    def save(self, tree: Mapping[str, Any], path: str) -> None:
        storage.save_file(dict(tree), path, durable=False)

    def load(self, path: str, like: Mapping[str, Any]) -> Mapping[str, Any]:
        """Load what :meth:`save` wrote (``like``: the saved tree, for frameworks whose load
        takes a target)."""
        return storage.load_file(path)

    # -- helpers ----------------------------------------------------------------------------
    def _names(self) -> list[str]:
        return [name_of(d) for d in self.dtypes]

    def _check_tree(self, tree: dict[str, np.ndarray], path: str) -> None:
        native = {k: self.to_native(v) for k, v in tree.items()}
        self.save(native, path)
        loaded = self.load(path, native)
        if sorted(loaded) != sorted(tree):
            raise AssertionError(f"keys differ: saved {sorted(tree)}, loaded {sorted(loaded)}")
        back = {k: self.from_native(loaded[k]) for k in tree}
        assert_identical(tree, back)

    # -- tests ------------------------------------------------------------------------------
    def test_declares_dtypes(self) -> None:
        if not self.dtypes:
            raise AssertionError("set `dtypes` to the dtypes your adapter stores")
        unknown = set(self._names()) - set(NAMES)
        if unknown:
            raise AssertionError(f"not dtypes of the format: {sorted(unknown)}")

    def test_conversion_is_exact(self) -> None:
        """``from_native(to_native(a))`` gives ``a``'s bits back (else nothing below counts)."""
        for name in self._names():
            a = code_sample(name)
            assert_identical(a, self.from_native(self.to_native(a)))

    def test_every_code_round_trips(self, tmp_path: Any) -> None:
        for name in self._names():
            self._check_tree({"codes": code_sample(name)}, os.path.join(tmp_path, f"codes-{name}"))

    def test_every_shape_round_trips(self, tmp_path: Any) -> None:
        for name in self._names():
            sample = code_sample(name, random=64, seed=1)
            tree = {f"s{i}": _shaped(sample, tuple(s)) for i, s in enumerate(self.shapes)}
            self._check_tree(tree, os.path.join(tmp_path, f"shapes-{name}"))

    def test_strided_inputs_round_trip(self, tmp_path: Any) -> None:
        if not self.strided_inputs:
            return
        for name in self._names():
            base = _shaped(code_sample(name, random=64, seed=2), (6, 8))
            tree = {"transposed": base.T, "strided": base[:, ::2], "offset": base[1:, 3:]}
            self._check_tree(tree, os.path.join(tmp_path, f"strided-{name}"))


# --------------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------------


def _mixed_tree() -> dict[str, Any]:
    tree: dict[str, Any] = {f"t/{n}": code_sample(n, random=32)[:96] for n in NAMES}
    tree.update(
        {
            "step": 10**30 + 1,
            "lr": float.fromhex("-0x1.0p-1074"),
            "name": "é/ü",
            "blob": b"\x00\xff",
            "shape": (3, (4,)),
            "none": None,
        }
    )
    return tree


class StorageTests:
    """Base class for a storage location's conformance tests (subclass as ``Test...``).

    Implement :meth:`location` (a fresh, empty directory or object-store URL per call); set
    ``storage_options`` when your URLs need them. ``machine_runs``/``machine_steps`` size
    the state machine run; ``machine_class`` picks the machine (a subclass of
    ``CheckpointManagerMachine`` with your fault injection, say)."""

    storage_options: Mapping[str, str] | None = None
    machine_runs: int = 5
    machine_steps: int = 15
    machine_class: Any = None

    def location(self) -> str:
        raise NotImplementedError("StorageTests: return a fresh, empty directory or URL")

    def _prefix(self, name: str, where: str | None = None) -> str:
        return f"{(where or self.location()).rstrip('/')}/{name}"

    def _opts(self) -> dict[str, Any]:
        return {} if self.storage_options is None else {"storage_options": self.storage_options}

    def _names(self, directory: str) -> list[str]:
        if storage.is_url(directory):
            return sorted(
                n for n in storage.list_url(directory, **self._opts()) if not n.endswith("/")
            )
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []

    def test_round_trip_every_dtype_and_value(self) -> None:
        assert_roundtrip(_mixed_tree(), path=self._prefix("ck"), durable=False, **self._opts())

    def test_round_trip_chunked_and_compressed(self) -> None:
        rng = np.random.default_rng(3)
        tree = {
            "noise": rng.integers(0, 2**32, 600_000, dtype=np.uint32).view(np.float32),
            "smooth": np.cumsum(rng.standard_normal(300_000)).astype(np.float32),
        }
        for compression in ("zstd", "none"):
            assert_roundtrip(
                tree,
                path=self._prefix(f"big-{compression}"),
                compression=compression,
                chunk_bytes=1 << 16,
                durable=False,
                **self._opts(),
            )

    def test_ranged_reads(self) -> None:
        a = np.arange(1000 * 37, dtype=np.float32).reshape(1000, 37)
        p = self._prefix("ranges")
        storage.save_file({"a": a}, p, chunk_bytes=4096, durable=False, **self._opts())
        with storage.open(p, **self._opts()) as r:
            if r.info("a").chunks < 2:
                raise AssertionError("the value was meant to span several chunks")
            for lo, hi in [
                (0, 1),
                (0, 1000),
                (110, 113),
                (999, 1000),
                (-5, -1),
                (500, 2000),
                (7, 7),
                (900, 10),
            ]:
                assert_identical(a[lo:hi], np.asarray(r.slice("a", lo, hi)))
            assert_identical(a[3:900:7, 5:30], np.asarray(r.get_slice("a")[3:900:7, 5:30]))

    def test_open_readers_never_see_a_later_save(self) -> None:
        """A reader opened before the prefix was saved over reads the old values: local files
        stay readable (unlinked, still mapped); on an object store, whose old shards are
        deleted after the new commit, a value not read yet may raise ``NotFoundError``, never
        a new or mixed value."""
        p = self._prefix("overwrite")
        old = {"w": np.full(5000, 1.5, np.float64), "tag": "old"}
        new = {"w": np.full(7000, -2.5, np.float64), "tag": "new", "extra": 1}
        storage.save_file(old, p, durable=False, **self._opts())
        with storage.open(p, **self._opts()) as r:
            storage.save_file(new, p, durable=False, **self._opts())
            if sorted(r.keys()) != sorted(old):
                raise AssertionError(f"an open reader's keys changed to {sorted(r.keys())}")
            for k in old:
                try:
                    assert_identical(old[k], r[k])
                except NotFoundError:
                    if not storage.is_url(p):
                        raise
        assert_identical(new, storage.load_file(p, **self._opts()))

    def test_refused_save_keeps_the_previous_one(self) -> None:
        p = self._prefix("refused")
        storage.save_file({"v": np.arange(4)}, p, durable=False, **self._opts())
        before = self._names(os.path.dirname(p) if not storage.is_url(p) else p.rsplit("/", 1)[0])
        try:
            storage.save_file(
                {"v": np.arange(5), "bad": object()}, p, durable=False, **self._opts()
            )
        except UnsupportedDTypeError:
            pass
        else:
            raise AssertionError("saving an object() must be refused")
        assert_identical({"v": np.arange(4)}, storage.load_file(p, **self._opts()))
        after = self._names(os.path.dirname(p) if not storage.is_url(p) else p.rsplit("/", 1)[0])
        check(after == before, f"a refused save left {sorted(set(after) - set(before))}")

    def test_listing_shows_committed_checkpoints(self) -> None:
        d = self.location()
        for i, shards in enumerate((1, 2, 3)):
            storage.save_file(
                {"x": np.arange(10 + i)},
                self._prefix(f"ck{i}", d),
                shards=shards,
                durable=False,
                **self._opts(),
            )
        names = self._names(d)
        if [n for n in names if n.endswith(".index")] != ["ck0.index", "ck1.index", "ck2.index"]:
            raise AssertionError(f"listing shows {names}, expected ck0.index, ck1.index, ck2.index")
        if not all(n.split(".")[0] in ("ck0", "ck1", "ck2") for n in names):
            raise AssertionError(f"listing shows files of no committed checkpoint: {names}")
        for i in range(3):
            if not storage.exists(self._prefix(f"ck{i}", d), **self._opts()):
                raise AssertionError(f"exists() is False for the committed ck{i}")
        if storage.exists(self._prefix("ck3", d), **self._opts()):
            raise AssertionError("exists() is True for ck3, never saved")

    def test_delete(self) -> None:
        d = self.location()
        a, b = self._prefix("a", d), self._prefix("b", d)
        storage.save_file({"x": np.arange(3)}, a, shards=2, durable=False, **self._opts())
        storage.save_file({"x": np.arange(4)}, b, durable=False, **self._opts())
        storage.remove(a, **self._opts())
        if storage.exists(a, **self._opts()):
            raise AssertionError("exists() is True after remove()")
        if any(n.startswith("a.") for n in self._names(d)):
            raise AssertionError(f"remove() left {self._names(d)}")
        for call in (storage.remove, storage.load_file):
            try:
                call(a, **self._opts())
            except NotFoundError:
                pass
            else:
                raise AssertionError(
                    f"{call.__name__} of a deleted checkpoint must raise NotFoundError"
                )
        assert_identical({"x": np.arange(4)}, storage.load_file(b, **self._opts()))

    def test_concurrent_writers(self) -> None:
        """Threads saving to their own prefixes all succeed; threads saving to one prefix
        leave one whole save there, never a mix (an object store may refuse the later commits
        with ``CheckpointIOError``; a local directory commits them one after another under its
        commit lock, so there every save succeeds and the last one wins)."""
        d = self.location()
        trees = [{"w": np.full(20_000, i, np.int32), "i": i} for i in range(4)]
        errors: dict[str, BaseException] = {}

        def write(prefix: str, tree: dict[str, Any], who: str) -> None:
            try:
                storage.save_file(tree, prefix, durable=False, **self._opts())
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors[who] = e

        jobs = [(self._prefix(f"own{i}", d), t, f"own{i}") for i, t in enumerate(trees)]
        jobs += [(self._prefix("same", d), t, f"same{i}") for i, t in enumerate(trees)]
        threads = [threading.Thread(target=write, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        own = {k: e for k, e in errors.items() if k.startswith("own")}
        if own:
            raise AssertionError(f"saves to distinct prefixes failed: {own}")
        same = {k: e for k, e in errors.items() if k.startswith("same")}
        if len(same) == len(trees) or not all(
            isinstance(e, CheckpointIOError) for e in same.values()
        ):
            raise AssertionError(f"saves to one prefix: {same}")
        for i, tree in enumerate(trees):
            assert_identical(tree, storage.load_file(self._prefix(f"own{i}", d), **self._opts()))
        got = storage.load_file(self._prefix("same", d), **self._opts())
        if f"same{int(got['i'])}" in same:
            raise AssertionError(f"the prefix holds save {got['i']}, which reported failure")
        assert_identical(trees[int(got["i"])], got)  # one whole save, never a mix of two

    def test_multi_writer_merge(self) -> None:
        p = self._prefix("merged")
        world = 3
        for rank in range(world):
            with storage.Writer(
                p, rank=rank, world_size=world, merge_token="s1", durable=False, **self._opts()
            ) as w:
                w.add(f"rank{rank}/w", np.full(100, rank, np.float32))
        storage.merge(p, world, durable=False, token="s1", **self._opts())
        want = {f"rank{r}/w": np.full(100, r, np.float32) for r in range(world)}
        assert_identical(want, storage.load_file(p, **self._opts()))

    def test_manager_state_machine(self) -> None:
        """``CheckpointManagerMachine`` (or ``machine_class``) on this storage (Hypothesis)."""
        from .stateful import CheckpointManagerMachine, run_machine

        base = self.machine_class or CheckpointManagerMachine
        where = self.location

        # the base is chosen at run time (the user's machine class): mypy cannot check it
        class OnThisStorage(base):  # type: ignore[misc, valid-type]
            def make_directory(self) -> str:
                return where()

            def remove_directory(self, directory: str) -> None:
                pass  # the location belongs to the subclass (and to its clean-up)

        run_machine(OnThisStorage, runs=self.machine_runs, steps=self.machine_steps)
