"""Hypothesis strategies for property tests of checkpoints (``pip install shardpoint[testing]``).

Every argument takes a value or a strategy (``dtype="bfloat16"`` or ``dtype=dtypes()``), and
every strategy draws the simplest values first, so a failing example shrinks to a small one:
``bool`` before ``float8_e8m0fnu``, 0-d before 4-d, ``0`` bits before a NaN payload, a leaf
before a container.

* :func:`dtypes` — every dtype shardpoint stores, as numpy, torch or jax dtype objects;
* :func:`shapes` — 0-d and zero-size shapes included;
* :func:`tensors` — numpy arrays, torch tensors or jax arrays; ``mode="bits"`` draws raw bit
  patterns (NaN payloads and signs, ``-0.0``, subnormals, infinities, every float8/float4 code;
  ``hypothesis.extra.numpy`` cannot draw bfloat16/float8 at all), in several memory layouts;
* :func:`keys` — names with ``.``, ``/``, unicode and near-collisions (``a``, ``a.b``, ``a/b``);
* :func:`state_dicts` — nested trees of tensors and Python scalars, with aliased tensors;
* :func:`python_objects` — the non-tensor values the format stores (FORMAT.md §6.1);
* :func:`save_options` — keyword arguments of ``sp.save_file``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import pathlib
import types
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

try:
    from hypothesis import event
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as npst
except ImportError as e:  # the kit's assertions work without it; the strategies do not
    raise ImportError(
        "shardpoint.testing.strategies needs Hypothesis: pip install 'shardpoint[testing]'"
    ) from e

from ..storage.dtypes import numpy_dtype
from ..storage.objects import register_type
from ._bits import (
    FAMILIES,
    element_bits,
    float64_specials,
    planted_groups,
    special_codes,
    uint_dtype,
)
from ._frameworks import LAYOUTS, apply_layout, framework_dtype, layout_base_shape, name_of
from ._frameworks import supported_names as _supported

__all__ = [
    "dtypes",
    "shapes",
    "tensors",
    "keys",
    "state_dicts",
    "python_objects",
    "save_options",
    "SampleConfig",
    "SampleColor",
    "SamplePoint",
]

SearchStrategy = st.SearchStrategy


def _get(draw: st.DrawFn, value: Any) -> Any:
    """A drawn value when ``value`` is a strategy, else ``value`` itself."""
    return draw(value) if isinstance(value, SearchStrategy) else value


def _fixed(*values: Any) -> bool:
    return not any(isinstance(v, SearchStrategy) for v in values)


# --------------------------------------------------------------------------------------------
# dtypes and shapes
# --------------------------------------------------------------------------------------------


def _names(framework: str, include: Iterable[Any] | None, exclude: Iterable[Any]) -> list[str]:
    names = list(_supported(framework))
    if include is not None:
        wanted = {name_of(d) for d in include}
        unknown = wanted - set(names)
        if unknown:
            raise ValueError(f"dtypes {sorted(unknown)} are not stored for {framework}")
        names = [n for n in names if n in wanted]
    dropped = {name_of(d) for d in exclude}
    names = [n for n in names if n not in dropped]
    if not names:
        raise ValueError("dtypes(): include/exclude leave no dtype to draw")
    return names


def _families(framework: str, names: list[str]) -> SearchStrategy[Any]:
    parts = [[n for n in fam if n in names] for fam in FAMILIES]
    return st.one_of(
        *(st.sampled_from([framework_dtype(n, framework) for n in part]) for part in parts if part)
    )


def dtypes(
    *, framework: Any = "numpy", include: Any = None, exclude: Any = ()
) -> SearchStrategy[Any]:
    """Dtypes shardpoint stores, simplest first: bool and the integers 8..64; float32/64,
    float16, complex64/128; bfloat16, every float8 variant, packed float4. Each of these three
    families is drawn about a third of the time, so the rare formats are drawn often; a
    failing example shrinks towards ``bool``.

    ``framework``: ``"numpy"`` (numpy dtypes; ml_dtypes types for bfloat16/float8, a tagged
    uint8 for float4), ``"torch"`` (torch dtypes) or ``"jax"`` (what ``jnp.asarray`` keeps:
    64-bit types only with ``jax_enable_x64``). ``include``/``exclude``: dtypes or format
    names (``"bfloat16"``) to keep or drop.
    """
    if _fixed(framework, include, exclude):
        return _families(framework, _names(framework, include, exclude))

    @st.composite
    def draw_one(draw: st.DrawFn) -> Any:
        fw = _get(draw, framework)
        return draw(_families(fw, _names(fw, _get(draw, include), _get(draw, exclude))))

    return draw_one()


@functools.cache
def _default_dtypes(framework: str) -> SearchStrategy[Any]:
    return dtypes(framework=framework)


def shapes(
    *, min_dims: Any = 0, max_dims: Any = 4, min_side: Any = 0, max_side: Any = 8
) -> SearchStrategy[tuple[int, ...]]:
    """Array shapes, 0-d (``()``) and zero-size (``(3, 0)``) included, smallest first."""
    if _fixed(min_dims, max_dims, min_side, max_side):
        return npst.array_shapes(
            min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
        )
    return st.tuples(*(_as_strategy(v) for v in (min_dims, max_dims, min_side, max_side))).flatmap(
        lambda a: npst.array_shapes(min_dims=a[0], max_dims=a[1], min_side=a[2], max_side=a[3])
    )


def _as_strategy(v: Any) -> SearchStrategy[Any]:
    return v if isinstance(v, SearchStrategy) else st.just(v)


# --------------------------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------------------------


def _specials(values: list[Any]) -> SearchStrategy[Any]:
    """The first (simplest) special value, then the others: Hypothesis favours the first
    choice of a sampled_from, so the second (-0.0, the sign bit) gets a list of its own."""
    return st.one_of(st.just(values[0]), st.sampled_from(values[1:]))


def _codes(name: str, width: int) -> SearchStrategy[int]:
    if name == "bool":
        return st.integers(0, 1)
    return st.one_of(_specials(special_codes(name)), st.integers(0, (1 << width) - 1))


def _plant_specials(draw: st.DrawFn, name: str, raw: np.ndarray) -> None:
    """Three times in four, overwrite up to ten elements of a float array's codes with
    special codes drawn from ``planted_groups`` (a NaN half the time; else -0.0, a
    subnormal, an infinity or an extreme of the exponent). Elements drawn one by one hit them too
    rarely: arrays hold a few elements, mostly one fill value (how ``hypothesis.extra.numpy``
    draws arrays), and a bug that canonicalised float32 NaNs went unnoticed in one run of 100
    examples out of five.

    One 32-bit draw decides everything (whether, where, which codes): Hypothesis leans
    towards the simplest choice of each small draw (``False``, the first of a list) for a
    whole run, which starved whole runs of NaNs; a wide integer is near uniform. It shrinks
    to 0, "planted nothing"."""
    groups = planted_groups(name)
    if not groups or raw.size == 0:
        return
    plan = draw(st.integers(0, 2**32 - 1))
    if plan % 4 == 0:
        return
    rng = np.random.default_rng(plan)
    flat = raw.reshape(-1)
    if name == "complex64":  # complex values plant into one half (a float of half the width)
        flat = flat.view(np.uint32)
    # NaNs are the group bugs treat worst (canonicalised, payload or sign dropped): drawn
    # as often as all the others together, so that an array of one element gets one too
    weights = np.full(len(groups), 0.5 / max(1, len(groups) - 1))
    weights[0] = 0.5 if len(groups) > 1 else 1.0
    for g in rng.choice(len(groups), size=min(flat.size, 2 * len(groups)), p=weights):
        group = groups[g]
        flat[rng.integers(flat.size)] = group[rng.integers(len(group))]


def _bits_array(draw: st.DrawFn, name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = numpy_dtype(name)
    if name == "complex64":  # a float32 pair: real in the low half (little-endian order)
        half = _codes(name, 32)
        pairs = st.builds(lambda re, im: re | (im << 32), half, half)
        raw = draw(npst.arrays(np.uint64, shape, elements=pairs))
    elif name == "complex128":
        raw = draw(npst.arrays(np.uint64, (*shape, 2), elements=_codes(name, 64)))
    else:
        width = element_bits(name)
        raw = draw(npst.arrays(uint_dtype(width), shape, elements=_codes(name, width)))
    _plant_specials(draw, name, raw)
    if name == "bool":
        return raw.astype(np.bool_)
    if not np.little_endian:  # the codes are little-endian element values
        raw = raw.byteswap()
    return raw.view(dtype).reshape(shape)


def _values_array(draw: st.DrawFn, name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = numpy_dtype(name)
    if dtype.metadata:  # packed float4: two codes per byte, no numeric value to draw
        return _bits_array(draw, name, shape)
    if dtype.kind in "biufc":
        return draw(npst.arrays(dtype, shape, elements=npst.from_dtype(dtype)))
    # bfloat16 / float8: any float32, rounded by the cast as a framework would
    wide = draw(npst.arrays(np.float32, shape, elements=st.floats(width=32)))
    with np.errstate(over="ignore", invalid="ignore"):
        return wide.astype(dtype)


def tensors(
    dtype: Any = None,
    shape: Any = None,
    *,
    framework: Any = "numpy",
    mode: Any = "bits",
    layout: Any = None,
) -> SearchStrategy[Any]:
    """Tensors of ``framework`` (``"numpy"``, ``"torch"`` or ``"jax"``).

    ``dtype``: a dtype of any framework, a format name, or a strategy (default
    :func:`dtypes` of ``framework``); ``shape``: a shape or a strategy (default :func:`shapes`).
    ``mode="bits"`` draws each element's raw bits (special codes first: zeros, -0.0, NaNs with
    payloads and signs, infinities, subnormals, extremes; then any code); ``mode="values"``
    draws numbers (``hypothesis.extra.numpy.from_dtype``; bfloat16/float8 as float32 rounded
    by the cast). ``layout``: one of :data:`LAYOUTS` for the framework or a strategy (default:
    any): numpy arrays transposed, strided, Fortran-ordered, reversed, broadcast or
    big-endian; torch tensors transposed, strided, at a storage offset or expanded.
    """

    @st.composite
    def draw_tensor(draw: st.DrawFn) -> Any:
        fw = _get(draw, framework)
        name = name_of(_get(draw, _default_dtypes(fw) if dtype is None else dtype))
        shp = tuple(int(n) for n in _get(draw, shapes() if shape is None else shape))
        how = _get(draw, mode)
        if how not in ("bits", "values"):
            raise ValueError(f"mode must be 'bits' or 'values', got {how!r}")
        lay = _get(draw, st.sampled_from(LAYOUTS[fw]) if layout is None else layout)
        if lay not in LAYOUTS[fw]:
            raise ValueError(f"layout {lay!r} is not one of {fw}'s {LAYOUTS[fw]}")
        base_shape = layout_base_shape(lay, shp)
        base = (_bits_array if how == "bits" else _values_array)(draw, name, base_shape)
        event(f"tensors: {fw} {name}")
        return apply_layout(fw, lay, base, shp)

    return draw_tensor()


# --------------------------------------------------------------------------------------------
# keys, scalars, trees
# --------------------------------------------------------------------------------------------

# simplest first; near-collisions of the ways frameworks join nested names
_KEY_ATOMS = [
    "a",
    "b",
    "a.b",
    "a/b",
    "a.b/c",
    "a/b.c",
    "weight",
    "layer.0.weight",
    "layer/0/weight",
    ".",
    "/",
    "..",
    "a.",
    ".a",
    "a/",
    "/a",
    "a//b",
    "~1",
    " ",
    "é",
    "\U0001f600",
    "Σ/σ",
    "0",
]
_KEY_TEXT = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    min_size=1,
    max_size=16,
)


def keys() -> SearchStrategy[str]:
    """Names a checkpoint must keep apart: plain ones first, then names holding ``.`` and
    ``/`` and their near-collisions (``a``, ``a.b``, ``a/b``, ``a.b/c``), unicode, any text."""
    joined = st.lists(st.sampled_from(_KEY_ATOMS[:9]), min_size=2, max_size=4).flatmap(
        lambda parts: st.sampled_from([".", "/"]).map(lambda sep: sep.join(parts))
    )
    return st.one_of(st.sampled_from(_KEY_ATOMS), joined, _KEY_TEXT)


_all_keys = keys  # state_dicts() has an argument of that name

_BIG_INTS = [
    2**53 + 1,
    -(2**53) - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    2**64 + 1,
    10**30 + 7,
    -(2**100) + 3,
]


def _scalars() -> SearchStrategy[Any]:
    """Python leaves of a state dict: floats by their bits too (NaN payloads, -0.0), ints up
    to and past 64 bits, bools, None, text and bytes."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**31), 2**31) | st.sampled_from(_BIG_INTS) | st.integers(),
        _specials(float64_specials()) | st.floats(),
        st.text(max_size=8),
        st.binary(max_size=8),
    )


def _tree(
    draw: st.DrawFn, leaf: SearchStrategy[Any], key: SearchStrategy[str], budget: int, depth: int
) -> tuple[Any, int]:
    """One node of at most ``budget`` leaves: a leaf first (shrinks there), else a container."""
    if budget <= 1 or depth >= 3 or not draw(st.booleans()):
        return draw(leaf), 1
    kind = draw(st.sampled_from(["dict", "list", "tuple"]))
    n = draw(st.integers(0, min(4, budget)))
    if kind == "dict":  # as many distinct names as the key strategy has, at most n
        names = draw(st.lists(key, max_size=n, unique=True))
        n = len(names)
    items, used = [], 0
    for _ in range(n):
        if used >= budget:
            break
        child, k = _tree(draw, leaf, key, budget - used, depth + 1)
        items.append(child)
        used += k
    if kind == "dict":
        return dict(zip(names, items, strict=False)), used  # (fewer items: budget spent)
    return (items if kind == "list" else tuple(items)), used


def _tensor_slots(tree: Any) -> list[Any]:
    from .assertions import is_tensor

    out: list[Any] = []
    if is_tensor(tree):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            out += _tensor_slots(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            out += _tensor_slots(v)
    return out


def _view_of(x: Any) -> Any:
    """Another tensor object viewing ``x``'s memory (numpy/torch; jax arrays are immutable:
    ``x`` itself), half the time only part of it."""
    kind = type(x).__module__.split(".")[0]
    if kind not in ("numpy", "torch"):
        return x
    if x.ndim and x.shape[0] > 1:
        return x[:1]
    return x[...] if kind == "numpy" else x.view(x.shape)


_STATE_SHAPES = shapes(max_dims=3, max_side=4)


def _key_strategy(keys: Any) -> SearchStrategy[str]:
    """A strategy of keys from a strategy, one name, or a collection of names."""
    if isinstance(keys, SearchStrategy):
        return keys
    if isinstance(keys, str):
        return st.just(keys)
    return st.sampled_from(list(keys))


def state_dicts(
    *,
    values: Any = None,
    keys: Any = None,
    max_leaves: Any = 16,
    aliasing: Any = True,
    scalars: Any = None,
) -> SearchStrategy[dict[str, Any]]:
    """State dicts: ``{str: value}`` whose values are tensors (``values``, default
    :func:`tensors` of at most 3 dimensions of at most 4), Python scalars (``scalars``, default: floats by their bits, ints past 64
    bits, bools, None, text, bytes; pass :func:`python_objects` for more) or dicts, lists and
    tuples of those, at most ``max_leaves`` leaves in all. ``keys``: a strategy, or the names
    to draw from (a collection). With ``aliasing`` (a bool or a
    strategy), half the draws that hold a tensor also hold one of them twice: the same
    object under a second key, or a view of it (tied weights).
    """
    key_s = _all_keys() if keys is None else _key_strategy(keys)

    @st.composite
    def draw_state(draw: st.DrawFn) -> dict[str, Any]:
        tensor = tensors(shape=_STATE_SHAPES) if values is None else _as_strategy(values)
        scalar = _scalars() if scalars is None else _as_strategy(scalars)
        # tensors twice as often as scalars: a state dict is mostly tensors. (Not
        # ``one_of(tensor, scalar, tensor)``: one_of drops the repeat and flattens the
        # scalars' own one_of, so a leaf was a tensor one time in seven.)
        leaf = st.integers(0, 2).flatmap(lambda i: scalar if i == 2 else tensor)
        budget = int(_get(draw, max_leaves))
        n = draw(st.integers(0, min(budget, 8)))
        # the default keys never run out: exactly n names; a few given names may
        names = draw(st.lists(key_s, min_size=n if keys is None else 0, max_size=n, unique=True))
        out: dict[str, Any] = {}
        used = 0
        for name in names:
            if used >= budget:
                break
            node, k = _tree(draw, leaf, key_s, budget - used, 1)
            out[name] = node
            used += k
        slots = _tensor_slots(out)
        if slots and _get(draw, aliasing) and draw(st.booleans()):
            shared = draw(st.sampled_from(slots))
            second = draw(key_s)
            if second not in out:  # (a name already taken: no alias this time, no filtering)
                out[second] = shared if draw(st.booleans()) else _view_of(shared)
                event("state_dicts: aliased tensor")
        return out

    return draw_state()


# --------------------------------------------------------------------------------------------
# Python objects and save options
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SampleConfig:
    """A dataclass of hyper-parameters, as :func:`python_objects` draws them."""

    lr: float = 3e-4
    layers: tuple[int, ...] = (512,)
    name: str = ""


class SampleColor(enum.Enum):
    """An enum, as :func:`python_objects` draws its members."""

    RED = 1
    GREEN = "green"


class SamplePoint(NamedTuple):
    """A named tuple, as :func:`python_objects` draws them."""

    x: int
    y: float


_REGISTERED = False


def _register_samples() -> None:
    """Loads build only registered types (FORMAT.md §6.2): allow the sample classes."""
    global _REGISTERED
    if not _REGISTERED:
        for cls in (SampleConfig, SampleColor, SamplePoint):
            register_type(cls)
        _REGISTERED = True


def _zones() -> SearchStrategy[dt.tzinfo | None]:
    return st.none() | st.integers(-1439, 1439).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))


def python_objects() -> SearchStrategy[Any]:
    """Non-tensor values the format stores as typed entries (FORMAT.md §6.1): sets and
    frozensets, tuples, dicts with int keys, big ints, complex numbers, bytes/bytearray,
    numpy scalars of every dtype (by their bits), datetimes (with fixed-offset zones), dates,
    times, timedeltas, paths, ``Decimal`` (NaN and -0 included), ``UUID``, ``Namespace``,
    ``SimpleNamespace``, and registered user types (a dataclass, an enum, a named tuple:
    :class:`SampleConfig`, :class:`SampleColor`, :class:`SamplePoint`)."""
    _register_samples()
    floats = _specials(float64_specials()) | st.floats()
    small = st.one_of(st.integers(-5, 5), st.text(max_size=4))
    numpy_scalar = tensors(shape=(), layout="contiguous").map(lambda a: a[()])
    return st.one_of(
        st.sets(small, max_size=4),
        st.frozensets(small, max_size=4),
        st.tuples(small, floats),
        st.dictionaries(st.integers(-3, 3), small, max_size=3),
        st.sampled_from(_BIG_INTS) | st.integers(min_value=2**64),
        st.builds(complex, floats, floats),
        st.binary(max_size=8).map(bytearray),
        numpy_scalar,
        st.datetimes(timezones=_zones()),
        st.dates(),
        st.times(timezones=_zones()),
        st.timedeltas(),
        st.sampled_from(
            [
                pathlib.Path("a/b.pt"),
                pathlib.PurePosixPath("/x/y"),
                pathlib.PureWindowsPath("C:\\run"),
            ]
        ),
        st.decimals(allow_nan=True)
        | st.sampled_from([decimal.Decimal("-0"), decimal.Decimal("sNaN")]),
        st.uuids(),
        st.builds(argparse.Namespace, lr=floats, name=small),
        st.builds(types.SimpleNamespace, step=st.integers(), tags=st.lists(small, max_size=2)),
        st.builds(
            SampleConfig,
            lr=floats,
            layers=st.lists(st.integers(1, 9), max_size=3).map(tuple),
            name=st.text(max_size=4),
        ),
        st.sampled_from(list(SampleColor)),
        st.builds(SamplePoint, x=st.integers(), y=floats),
    )


_COMPRESSIONS = ["zstd", "none", "zstd-plain", "zstd-bytegroup", "bytegroup-huffman"]


def save_options(
    *,
    compression: Any = None,
    level: Any = None,
    chunk_bytes: Any = None,
    shards: Any = None,
    single_file: Any = None,
    digest: Any = None,
    durable: Any = False,
) -> SearchStrategy[dict[str, Any]]:
    """Keyword arguments for ``sp.save_file`` (and ``assert_roundtrip``): compression, zstd
    level, chunk size, number of shards, the single-file form, strong digests (not both: a
    single file has no digest manifest); each argument fixes one (a value) or narrows it (a
    strategy). ``durable`` defaults to ``False`` (no
    fsync: property tests write many checkpoints)."""
    defaults = {
        "compression": st.sampled_from(_COMPRESSIONS),
        "level": st.none() | st.integers(-7, 22),
        "chunk_bytes": st.sampled_from([None, 4096, 1 << 16]),
        "shards": st.none() | st.integers(1, 3),
        "single_file": st.booleans(),
        "digest": st.sampled_from([None, "sha256", "blake3"]),
    }
    given = {
        "compression": compression,
        "level": level,
        "chunk_bytes": chunk_bytes,
        "shards": shards,
        "single_file": single_file,
        "digest": digest,
        "durable": durable,
    }
    parts = {
        k: (defaults[k] if v is None and k in defaults else _as_strategy(v))
        for k, v in given.items()
    }
    return st.fixed_dictionaries(parts).map(_compatible)


def _compatible(options: dict[str, Any]) -> dict[str, Any]:
    """A single-file checkpoint records no digest manifest (FORMAT.md §10): digest wins."""
    if options.get("single_file") and options.get("digest"):
        options["single_file"] = False
    return options
