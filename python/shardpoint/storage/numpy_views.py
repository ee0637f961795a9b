"""numpy arrays that view one buffer, saved by :func:`save_file` and loaded back as views of
one buffer by :func:`load_file` — what ``torch.save``/``shardpoint.torch.save`` do for tensors
sharing a storage (FORMAT.md §7, section ``"shardpoint.numpy_views"``).

Each array is still stored whole under its own key (every reader, tool and older version reads
it as before); the section only records how the arrays overlapped. Arrays are grouped when
their byte ranges overlap (connected components of overlapping ``[lo, hi)`` ranges, so a group
covers one contiguous span of the original buffer, never the parts of it no saved array
touched); per member the section holds the offset of its first element in that span and its
strides. ``load_file`` allocates one span per group, writes each member's value into its place
and hands out the views: a write through one member shows through the others, as before the
save. The section is hostile input: a span larger than its members' extents, a member that
does not fit it or a value whose dtype/shape disagree with its entry is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import CorruptCheckpointError

__all__ = ["SECTION", "plan_views", "rebuild_views", "restore_views", "span_cap"]

SECTION = "shardpoint.numpy_views"


def span_cap(member_bytes: int) -> int:
    """The largest span recorded (and accepted) for members holding ``member_bytes`` bytes:
    views spread sparser than this over a buffer are saved unaliased, and a file claiming a
    larger span is refused (a hostile length never becomes an allocation)."""
    return 4 * member_bytes + (1 << 20)


def _bounds(a: np.ndarray) -> tuple[int, int, int]:
    """(lowest byte address, one past the highest, address of element 0)."""
    start = int(a.__array_interface__["data"][0])
    lo = hi = start
    for n, s in zip(a.shape, a.strides, strict=True):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + a.itemsize, start


def plan_views(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The section for the arrays of ``values`` that overlap another one (``None``: none do)."""
    spans = []
    for key, v in values.items():
        if type(v) is np.ndarray and v.size and v.dtype.kind not in "OUSV":
            lo, hi, start = _bounds(v)
            spans.append((lo, hi, start, key, v))
    if len(spans) < 2:
        return None
    spans.sort(key=lambda s: s[0])
    groups: list[list[tuple[int, int, int, str, np.ndarray]]] = []
    end = -1
    for s in spans:
        if groups and s[0] < end:
            groups[-1].append(s)
            end = max(end, s[1])
        else:
            groups.append([s])
            end = s[1]
    out = []
    for g in groups:
        if len(g) < 2:
            continue
        lo = g[0][0]
        hi = max(s[1] for s in g)
        if hi - lo > span_cap(sum(int(s[4].nbytes) for s in g)):
            continue  # too sparse to be worth a shared span: saved (and loaded) unaliased
        members = {
            key: {"offset": start - lo, "strides": list(v.strides)} for _, _, start, key, v in g
        }
        out.append({"nbytes": hi - lo, "members": members})
    return {"groups": out} if out else None


def _member(buf: np.ndarray, value: np.ndarray, spec: Any, where: str) -> np.ndarray:
    if not isinstance(spec, Mapping):
        raise CorruptCheckpointError(f"{where}: a member is not an object")
    offset, strides = spec.get("offset"), spec.get("strides")
    if (
        type(offset) is not int
        or not isinstance(strides, list)
        or len(strides) != value.ndim
        or any(type(s) is not int for s in strides)
    ):
        raise CorruptCheckpointError(f"{where}: offset/strides malformed")
    try:  # numpy checks every element lies inside the span (negative strides too)
        view = np.ndarray(value.shape, value.dtype, buffer=buf, offset=offset, strides=strides)
    except (ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{where}: the member does not fit its span ({e})") from e
    view[...] = value
    return view


def rebuild_views(
    out: dict[str, Any], section: Any, prefix: str, stored_bytes: Callable[[str], int]
) -> None:
    """Replace the loaded members of each group in ``out`` by views of one fresh span.
    ``stored_bytes(key)``: the raw size of a member's entry (members ``keys=`` left out
    count towards their group's span too)."""
    where = f"{prefix}.index: section {SECTION!r}"
    groups = section.get("groups") if isinstance(section, Mapping) else None
    if not isinstance(groups, list):
        raise CorruptCheckpointError(f"{where}: 'groups' is not a list")
    for gi, group in enumerate(groups):
        members = group.get("members") if isinstance(group, Mapping) else None
        nbytes = group.get("nbytes") if isinstance(group, Mapping) else None
        if not isinstance(members, Mapping) or type(nbytes) is not int or nbytes < 0:
            raise CorruptCheckpointError(f"{where}: group {gi} malformed")
        try:
            covered = sum(int(stored_bytes(k)) for k in members)
        except KeyError as e:
            raise CorruptCheckpointError(f"{where}: group {gi} names a missing key {e}") from e
        loaded = {k: out[k] for k in members if isinstance(out.get(k), np.ndarray)}
        if len(loaded) < 2:
            continue  # keys= left out the others: nothing to share
        if nbytes > span_cap(covered):
            raise CorruptCheckpointError(
                f"{where}: group {gi} claims a span of {nbytes} bytes, more than its members "
                "can cover"
            )
        buf = np.zeros(nbytes, np.uint8)
        for key, value in loaded.items():
            out[key] = _member(buf, value, members[key], f"{where}: group {gi} member {key!r}")


def restore_views(reader: Any, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` (what ``reader.load`` returned) with the members of each recorded group made
    views of one buffer again; unchanged for checkpoints without the section."""
    section = reader.sections.get(SECTION)
    if section is not None:
        prefix = str(getattr(reader, "_prefix", "checkpoint"))
        rebuild_views(out, section, prefix, lambda k: reader.info(k).raw_bytes)
    return out
