"""Mutations of a delta table (FORMAT.md §11), drawn by Hypothesis: a field replaced by any JSON
value, removed, or a table key added or dropped. Reading the forged checkpoint either raises one
of our errors (a ``CheckpointError``) or yields exactly the original values (a harmless edit):
never another exception, never other bytes. Both readers, ours and the reference reader."""

from __future__ import annotations

import atexit
import copy
import os
import shutil
import sys
import tempfile
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardpoint as sp
from shardpoint.delta.table import SECTION

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
import reference_reader as rr  # noqa: E402
import reference_reader_delta as rd  # noqa: E402

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
KEYS = ["w", "frozen", "b", "nope", "", "\ufdd0delta:w", "w\x00"]

_DIR = tempfile.mkdtemp(prefix="shardpoint-delta-fuzz-")  # one base for every example
atexit.register(shutil.rmtree, _DIR, True)
_BASE, _DELTA = os.path.join(_DIR, "base"), os.path.join(_DIR, "delta")


def _make() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any]]:
    rng = np.random.default_rng(5)
    a = {"w": rng.standard_normal(2048).astype(np.float32), "frozen": np.arange(512.0),
         "b": np.ones(3, np.float32)}  # fmt: skip
    b = {k: v.copy() for k, v in a.items()}
    b["w"][::50] += 1e-3
    sp.save_file(a, _BASE)
    sp.save_file(b, _DELTA, base=_BASE, delta=True)
    with sp.open(_DELTA) as r:
        stored = {k: r._plain[k] for k in r._plain.keys()}
        sections = dict(r.sections)
        assert r.delta_mode("w") == "xor" and r.delta_mode("frozen") == "same"
    return b, stored, sections


WANT, STORED, SECTIONS = _make()


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    """The table with one to three drawn edits."""
    t = copy.deepcopy(SECTIONS[SECTION])
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "base", "entry", "entry_field", "add", "drop"]))
        if where == "top":
            field = draw(st.sampled_from(["version", "base", "depth", "entries", "removed"]))
            if draw(st.booleans()):
                t.pop(field, None)
            else:
                t[field] = draw(JSON)
        elif where == "base" and isinstance(t.get("base"), dict):
            t["base"][draw(st.sampled_from(["path", "digest"]))] = draw(JSON)
        elif where in ("entry", "entry_field", "drop") and isinstance(t.get("entries"), dict):
            keys = sorted(t["entries"])
            if not keys:
                continue
            key = draw(st.sampled_from(keys))
            rec = t["entries"][key]
            if where == "drop":
                del t["entries"][key]
            elif where == "entry_field" and isinstance(rec, list) and rec:
                rec[draw(st.integers(0, len(rec) - 1))] = draw(
                    st.sampled_from(["same", "xor", "full"]) | st.integers(-1, 2**33) | JSON
                )
            else:
                t["entries"][key] = draw(JSON)
        elif where == "add" and isinstance(t.get("entries"), dict):
            t["entries"][draw(st.sampled_from(KEYS))] = [
                draw(st.sampled_from(["same", "xor"])), draw(st.integers(0, 2**32 - 1)),
                draw(st.integers(0, 2**32 - 1)),
            ]  # fmt: skip
    return t


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=mutations())
def test_mutated_table_is_refused_or_harmless(table: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(dir=_DIR) as d:
        p = os.path.join(d, "forged")
        sections = dict(SECTIONS)
        sections[SECTION] = table
        os.symlink(_BASE + ".index", os.path.join(d, "base.index"))
        for f in os.listdir(_DIR):
            if f.startswith("base.data"):
                os.symlink(os.path.join(_DIR, f), os.path.join(d, f))
        sp.save_file(STORED, p, _sections=sections, _internal_keys=True, durable=False)
        try:
            got = sp.load_file(p)
        except sp.CheckpointError:
            pass
        else:
            assert sorted(got) == sorted(WANT)
            for k, v in WANT.items():
                assert got[k].tobytes() == v.tobytes(), k
        try:
            ref = rd.read_resolved(p)
        except (rr.FormatError, FileNotFoundError):
            return
        assert sorted(ref) == sorted(WANT)
        for k, v in WANT.items():
            assert ref[k][2] == v.tobytes(), k
