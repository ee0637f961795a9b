"""Memory-budget planning for sequential models: the schedule with the least recomputation
whose peak saved-activation memory fits a budget.

The model (in the spirit of Rotor, Beaumont et al., "Optimal checkpointing for heterogeneous
chains"). Layer ``i`` maps ``x_i`` to ``x_{i+1}``; :mod:`._profile` measures ``s_i`` (bytes it
saves for backward), ``a_i`` (bytes of ``x_i``) and ``t_i`` (forward time). A schedule splits
the chain into consecutive pieces, each either

* *stored*: run normally, its saved tensors (``s_i``) kept until its backward; or
* *checkpointed*: only its input (``a_start``) kept; during backward it is re-run, and that
  re-run is itself a schedule of the same kind for the sub-chain (nested checkpoints).

Peak memory of a schedule with ``m`` bytes available: the pieces' kept bytes add up along
forward; a checkpointed piece is re-run during backward when every later piece has already
been freed, so it must fit its own sub-schedule in ``m`` minus what the earlier pieces and its
own input keep. With ``C(i, j, m)`` the least recompute time for sub-chain ``[i, j)`` within
``m`` bytes::

    C(i, j, m) = min( C(i+1, j, m - s_i),                                   # store layer i
                      min_k  T(i, k) + C(i, k, m - a_i) + C(k, j, m - a_i) )  # checkpoint [i, k)

with ``T(i, k)`` the forward time of layers ``i..k-1`` and ``C(j, j, m) = 0`` for ``m >= 0``.
Memory is discretized in ``slots`` units of ``budget / slots`` bytes, sizes rounded *up*, so
the expected peak of a plan never underestimates the model. The solve is vectorized over
memory: ``O(n^3 / 6)`` numpy operations on arrays of ``slots + 1`` entries.

What the model ignores (docs/ACTIVATION.md says more): gradients and the transient working
memory of the op running now; storages shared between layers are counted once per layer that
saves them (an overestimate); the time model counts a re-run layer at its full forward time
(early stop may end a re-run sooner); backward time is the same for every schedule and left
out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._profile import LayerProfile

__all__ = ["Plan", "Stored", "Checkpointed", "solve", "BudgetTooSmallError", "format_bytes"]


class BudgetTooSmallError(ValueError):
    """The memory budget is below what any schedule needs; the message states the minimum."""

    def __init__(self, message: str, minimum: int) -> None:
        super().__init__(message)
        self.minimum = minimum


@dataclass(frozen=True)
class Stored:
    """Layers ``start..stop-1`` run normally; their saved tensors are kept."""

    start: int
    stop: int


@dataclass(frozen=True)
class Checkpointed:
    """Layers ``start..stop-1`` run as one checkpoint keeping only its input; during backward
    they are re-run following ``inner``."""

    start: int
    stop: int
    inner: tuple[Stored | Checkpointed, ...]


Node = Stored | Checkpointed


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


def _shift(values: np.ndarray, by: int) -> np.ndarray:
    """``out[m] = values[m - by]`` (infinite where ``m < by``)."""
    out = np.full_like(values, np.inf)
    if by <= 0:
        return values.copy()
    if by < len(values):
        out[by:] = values[: len(values) - by]
    return out


@dataclass(frozen=True)
class _Sizes:
    """Per-layer sizes in planner units (see :func:`solve`)."""

    mid: list[int]  # saved bytes that are neither the layer's input nor its output
    sin: list[int]  # saved bytes of the input x_i (shared with whoever holds x_i)
    sout: list[int]  # saved bytes of the output x_{i+1}
    act: list[int]  # bytes of x_i, what a checkpoint starting at i keeps


def _sizes(profiles: Sequence[LayerProfile], unit: float) -> _Sizes:
    def up(v: int) -> int:
        return math.ceil(v / unit) if v > 0 else 0

    mid = [up(p.saved_bytes - p.saved_input_bytes - p.saved_output_bytes) for p in profiles]
    return _Sizes(
        mid=mid,
        sin=[up(p.saved_input_bytes) for p in profiles],
        sout=[up(p.saved_output_bytes) for p in profiles],
        act=[up(p.input_bytes) for p in profiles],
    )


def _stored_cost(z: _Sizes, i: int, held: int) -> tuple[int, int]:
    """Units layer ``i`` keeps when stored, given whether its input is already held; and
    whether its output is then held."""
    return z.mid[i] + z.sout[i] + (0 if held else z.sin[i]), int(z.sout[i] > 0)


Table = dict[tuple[int, int, int], np.ndarray]


def _solve_table(
    z: _Sizes, times: Sequence[float], slots: int, overhead: float = 0.0
) -> tuple[Table, Table]:
    """``cost[(i, j, held)][m]``: least recompute time for sub-chain ``[i, j)`` within ``m``
    units, ``held`` saying whether ``x_i`` is already counted by someone else."""
    n = len(z.mid)
    prefix = np.concatenate([[0.0], np.cumsum(times)])
    cost: Table = {}
    choice: Table = {}
    zero = np.zeros(slots + 1)
    for j in range(n + 1):
        for held in (0, 1):
            cost[(j, j, held)] = zero
    for length in range(1, n + 1):
        for i in range(0, n - length + 1):
            j = i + length
            for held in (0, 1):
                kept, out_held = _stored_cost(z, i, held)
                best = _shift(cost[(i + 1, j, out_held)], kept)  # store layer i
                pick = np.full(slots + 1, -1, dtype=np.int32)
                keep = 0 if held else z.act[i]
                for k in range(i + 1, j):  # checkpoint [i, k), then the rest
                    total = _shift(cost[(i, k, 1)] + cost[(k, j, 0)], keep) + (
                        prefix[k] - prefix[i] + overhead
                    )
                    better = total < best
                    if better.any():
                        best = np.where(better, total, best)
                        pick = np.where(better, k, pick)
                cost[(i, j, held)] = best
                choice[(i, j, held)] = pick
    return cost, choice


def _append_stored(nodes: list[Node], i: int) -> None:
    if nodes and isinstance(nodes[-1], Stored) and nodes[-1].stop == i:
        nodes[-1] = Stored(nodes[-1].start, i + 1)
    else:
        nodes.append(Stored(i, i + 1))


def _rebuild(choice: Table, z: _Sizes, i: int, j: int, m: int, held: int) -> list[Node]:
    nodes: list[Node] = []
    while i < j:
        k = int(choice[(i, j, held)][m])
        if k < 0:
            kept, held = _stored_cost(z, i, held)
            _append_stored(nodes, i)
            m -= kept
            i += 1
        else:
            m -= 0 if held else z.act[i]
            nodes.append(Checkpointed(i, k, tuple(_rebuild(choice, z, i, k, m, 1))))
            i, held = k, 0
    return nodes


class Plan:
    """A schedule for one chain: which layers are kept, which checkpointed (and how their
    recompute is itself scheduled), with the modelled peak and extra compute.

    ``str(plan)`` is a table; :func:`shardpoint.activation.checkpoint_sequential` and
    :class:`shardpoint.activation.CheckpointedSequential` run it.
    """

    def __init__(
        self,
        profiles: Sequence[LayerProfile],
        nodes: Sequence[Node],
        memory_budget: int,
        minimum_budget: int,
        offload: str | None,
    ) -> None:
        self.profiles = list(profiles)
        self.nodes = tuple(nodes)
        self.memory_budget = int(memory_budget)
        self.minimum_budget = int(minimum_budget)
        self.offload = offload
        self.expected_peak = _peak(self.nodes, self.profiles, offload_top=offload is not None)
        self.extra_seconds = _extra(self.nodes, self.profiles)
        self.forward_seconds = sum(p.forward_seconds for p in self.profiles)

    @property
    def segments(self) -> list[tuple[int, int, bool]]:
        """Top-level pieces as ``(start, stop, checkpointed)``."""
        return [(n.start, n.stop, isinstance(n, Checkpointed)) for n in self.nodes]

    def recompute_counts(self) -> list[int]:
        """How many times each layer is re-run during one backward (model)."""
        counts = [0] * len(self.profiles)

        def walk(nodes: Sequence[Node], depth: int) -> None:
            for node in nodes:
                if isinstance(node, Checkpointed):
                    for i in range(node.start, node.stop):
                        counts[i] += 1
                    walk(node.inner, depth + 1)

        walk(self.nodes, 0)
        return counts

    def table(self) -> str:
        """The plan as a text table (also ``str(plan)``)."""
        rows = []
        kept_so_far = 0
        for node in self.nodes:
            first, last = self.profiles[node.start], self.profiles[node.stop - 1]
            layers = first.name if node.stop - node.start == 1 else f"{first.name} .. {last.name}"
            if isinstance(node, Stored):
                kept = sum(p.saved_bytes for p in self.profiles[node.start : node.stop])
                what = "all saved tensors"
                extra = 0.0
                peak = kept_so_far + kept
            else:
                kept = 0 if self.offload else first.input_bytes
                inner = sum(isinstance(n, Checkpointed) for n in node.inner)
                what = f"input only ({self.offload})" if self.offload else "input only"
                if inner:
                    what += f", {inner} nested checkpoint(s) in its recompute"
                extra = _extra((node,), self.profiles)
                peak = (
                    kept_so_far
                    + first.input_bytes
                    + _peak(node.inner, self.profiles, offload_top=False)
                )
            kept_so_far += kept
            rows.append(
                (layers, what, format_bytes(kept), format_bytes(peak), f"{extra * 1e3:.2f} ms")
            )
        header = ("layers", "kept until backward", "kept bytes", "peak while here", "extra")
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(5)]
        line = "  ".join("{:<" + str(w) + "}" for w in widths)
        out = [
            f"activation plan: {len(self.profiles)} layers, budget "
            f"{format_bytes(self.memory_budget)} (minimum {format_bytes(self.minimum_budget)}), "
            f"expected peak {format_bytes(self.expected_peak)}, extra compute "
            f"{self.extra_seconds * 1e3:.2f} ms per step "
            f"({100 * self.extra_seconds / max(self.forward_seconds, 1e-12):.0f}% of a forward)"
            + (f", offload={self.offload}" if self.offload else ""),
            line.format(*header),
        ]
        out += [line.format(*r) for r in rows]
        return "\n".join(out)

    __str__ = table

    def __repr__(self) -> str:
        return (
            f"Plan(layers={len(self.profiles)}, segments={self.segments}, "
            f"expected_peak={self.expected_peak}, extra_seconds={self.extra_seconds:.6f})"
        )


def _peak(
    nodes: Sequence[Node],
    profiles: Sequence[LayerProfile],
    *,
    offload_top: bool,
    held: bool = False,
) -> int:
    """Modelled peak of ``nodes`` in bytes (same model as the solver, without rounding)."""
    kept = 0
    peak = 0
    for node in nodes:
        if isinstance(node, Stored):
            for p in profiles[node.start : node.stop]:
                kept += p.saved_bytes - (p.saved_input_bytes if held else 0)
                held = p.saved_output_bytes > 0
                peak = max(peak, kept)
        else:
            a = 0 if held else profiles[node.start].input_bytes
            inner = _peak(node.inner, profiles, offload_top=False, held=True)
            peak = max(peak, kept + a + inner)
            kept += 0 if offload_top else a
            peak = max(peak, kept)
            held = False
    return peak


def _extra(nodes: Sequence[Node], profiles: Sequence[LayerProfile]) -> float:
    total = 0.0
    for node in nodes:
        if isinstance(node, Checkpointed):
            total += sum(p.forward_seconds for p in profiles[node.start : node.stop])
            total += _extra(node.inner, profiles)
    return total


def solve(
    profiles: Sequence[LayerProfile],
    memory_budget: int,
    *,
    offload: str | None = None,
    slots: int = 600,
    overhead_seconds: float = 0.0,
    prefer_even_split: bool = True,
) -> Plan:
    """The plan with the least modelled recompute whose modelled peak fits ``memory_budget``.

    With ``offload`` the inputs kept by top-level checkpoints live in host memory or on disk,
    so they do not count against the budget while they wait; each is back in memory while its
    piece is re-run. ``overhead_seconds`` is the fixed cost of one checkpoint (bookkeeping,
    random-state stash and replay), added per checkpoint so that many tiny pieces are not
    preferred to fewer larger ones on paper only. With ``prefer_even_split`` the best even
    split that fits is used unless the DP's plan is modelled at least
    :data:`EVEN_SPLIT_MARGIN` cheaper.

    Raises:
        BudgetTooSmallError: no schedule fits; the message states the minimum budget.
    """
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)):
        raise TypeError(f"memory_budget must be a number of bytes, got {memory_budget!r}")
    if not math.isfinite(memory_budget) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    n = len(profiles)
    if n == 0:
        raise ValueError("cannot plan an empty chain")
    times = [p.forward_seconds for p in profiles]
    everything = _peak([Stored(0, n)], profiles, offload_top=False)
    budget = int(memory_budget)
    minimum = _minimum(profiles, offload)
    if budget >= everything:
        # Keeping everything fits: no recompute at all.
        return Plan(profiles, [Stored(0, n)], budget, minimum, offload)
    if budget < minimum:
        raise BudgetTooSmallError(
            f"memory_budget {budget} bytes ({format_bytes(budget)}) is below the minimum any "
            f"schedule of these {n} layers needs: {minimum} bytes ({format_bytes(minimum)}); "
            f"keeping everything needs {everything} bytes ({format_bytes(everything)}).",
            minimum,
        )
    nodes = _solve_nodes(profiles, times, budget, offload, slots, overhead_seconds)
    if nodes is not None and prefer_even_split:
        nodes = _prefer_even_split(nodes, profiles, budget, offload, overhead_seconds)
    if nodes is None:
        # Rounding sizes up can make a budget just above the minimum infeasible.
        raise BudgetTooSmallError(
            f"memory_budget {budget} bytes ({format_bytes(budget)}) is too close to the "
            f"minimum ({minimum} bytes) for the planner's resolution; give at least "
            f"{math.ceil(minimum * 1.02)} bytes.",
            minimum,
        )
    return Plan(profiles, nodes, budget, minimum, offload)


#: The DP's plan must be modelled at least this much cheaper than the best even split
#: (PyTorch's checkpoint_sequential cut) that fits, or the even split is used. Per-layer
#: profile times on a loaded machine vary by about this much between identical layers, so a
#: smaller modelled gain is noise the DP would exploit (measured: a 20% modelled gain on a
#: uniform chain was 41% slower inside recomputes); on uniform chains the even split is what
#: the user would have written.
EVEN_SPLIT_MARGIN = 0.25


def _cost(nodes: Sequence[Node], profiles: Sequence[LayerProfile], overhead: float) -> float:
    count = 0

    def walk(ns: Sequence[Node]) -> None:
        nonlocal count
        for node in ns:
            if isinstance(node, Checkpointed):
                count += 1
                walk(node.inner)

    walk(nodes)
    return _extra(nodes, profiles) + overhead * count


def _prefer_even_split(
    nodes: list[Node],
    profiles: Sequence[LayerProfile],
    budget: int,
    offload: str | None,
    overhead: float,
) -> list[Node]:
    n = len(profiles)
    best: tuple[float, list[Node]] | None = None
    for k in range(2, n + 1):
        size = n // k
        even: list[Node] = [
            Checkpointed(i * size, (i + 1) * size, (Stored(i * size, (i + 1) * size),))
            for i in range(k - 1)
        ]
        even.append(Stored((k - 1) * size, n))
        if _peak(even, profiles, offload_top=offload is not None) > budget:
            continue
        cost = _cost(even, profiles, overhead)
        if best is None or cost < best[0]:
            best = (cost, even)
    if best is not None and _cost(nodes, profiles, overhead) > best[0] * (1 - EVEN_SPLIT_MARGIN):
        return best[1]
    return nodes


def _solve_nodes(
    profiles: Sequence[LayerProfile],
    times: Sequence[float],
    budget: int,
    offload: str | None,
    slots: int,
    overhead: float = 0.0,
) -> list[Node] | None:
    n = len(profiles)
    z = _sizes(profiles, budget / slots)
    cost, choice = _solve_table(z, times, slots, overhead)
    if not offload:
        if not np.isfinite(cost[(0, n, 0)][slots]):
            return None
        return _rebuild(choice, z, 0, n, slots, 0)
    # Top level with offload: checkpoint inputs wait elsewhere; inner re-runs as usual.
    prefix = np.concatenate([[0.0], np.cumsum(times)])
    top: dict[tuple[int, int], np.ndarray] = {(n, 0): np.zeros(slots + 1)}
    top[(n, 1)] = top[(n, 0)]
    pick: dict[tuple[int, int], np.ndarray] = {}
    for i in range(n - 1, -1, -1):
        for held in (0, 1):
            kept, out_held = _stored_cost(z, i, held)
            best = _shift(top[(i + 1, out_held)], kept)
            chosen = np.full(slots + 1, -1, dtype=np.int32)
            back = 0 if held else z.act[i]  # read back for the re-run
            for k in range(i + 1, n):
                total = _shift(cost[(i, k, 1)], back)
                total = total + top[(k, 0)] + (prefix[k] - prefix[i] + overhead)
                better = total < best
                if better.any():
                    best = np.where(better, total, best)
                    chosen = np.where(better, k, chosen)
            top[(i, held)] = best
            pick[(i, held)] = chosen
    if not np.isfinite(top[(0, 0)][slots]):
        return None
    nodes: list[Node] = []
    i, m, held = 0, slots, 0
    while i < n:
        k = int(pick[(i, held)][m])
        if k < 0:
            kept, held = _stored_cost(z, i, held)
            _append_stored(nodes, i)
            m -= kept
            i += 1
        else:
            back = 0 if held else z.act[i]
            nodes.append(Checkpointed(i, k, tuple(_rebuild(choice, z, i, k, m - back, 1))))
            i, held = k, 0
    return nodes


def _minimum(profiles: Sequence[LayerProfile], offload: str | None) -> int:
    """The smallest budget (bytes) any schedule fits in: bisection over feasibility, on a
    grid fine enough that rounding costs at most about 1%."""
    n = len(profiles)
    times = [p.forward_seconds for p in profiles]
    hi = _peak([Stored(0, n)], profiles, offload_top=False)
    lo = 0
    slots = 300
    for _ in range(12):
        if hi - lo <= max(hi // 200, 1):
            break
        mid = (lo + hi) // 2
        if _solve_nodes(profiles, times, max(mid, 1), offload, slots) is None:
            lo = mid
        else:
            hi = mid
    return hi


def run_plan(
    plan: Plan,
    functions: Sequence[Callable[[Any], Any]],
    value: Any,
    checkpoint_fn: Callable[..., Any],
    top_kwargs: dict[str, Any],
) -> Any:
    """Run ``functions`` on ``value`` following ``plan``: stored pieces normally, checkpointed
    pieces through ``checkpoint_fn`` (``top_kwargs`` only for top-level ones, e.g. offload)."""
    if len(functions) != len(plan.profiles):
        raise ValueError(
            f"the plan was made for {len(plan.profiles)} layers, got {len(functions)} functions"
        )
    return _run_nodes(plan.nodes, functions, value, checkpoint_fn, top_kwargs)


def _run_nodes(
    nodes: Sequence[Node],
    functions: Sequence[Callable[[Any], Any]],
    value: Any,
    checkpoint_fn: Callable[..., Any],
    kwargs: dict[str, Any] | None,
) -> Any:
    for node in nodes:
        if isinstance(node, Stored):
            for fn in functions[node.start : node.stop]:
                value = fn(value)
        else:
            value = checkpoint_fn(
                _Piece(node.inner, functions, checkpoint_fn), value, **(kwargs or {})
            )
    return value


class _Piece:
    """A checkpointed piece: re-runs its layers following its inner schedule."""

    __slots__ = ("nodes", "functions", "checkpoint_fn")

    def __init__(
        self,
        nodes: Sequence[Node],
        functions: Sequence[Callable[[Any], Any]],
        checkpoint_fn: Callable[..., Any],
    ) -> None:
        self.nodes = nodes
        self.functions = functions
        self.checkpoint_fn = checkpoint_fn

    def __call__(self, value: Any) -> Any:
        return _run_nodes(self.nodes, self.functions, value, self.checkpoint_fn, None)
