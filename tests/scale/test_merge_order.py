"""The merge's remembered order (rust/src/merge/order.rs, docs/SCALE.md): a coordinator whose
ranks write the same keys again merges in the order of its last merge at that prefix, and the
committed index is byte for byte the one the heap merge builds; a changed layout, or a rank
whose keys changed while its entry count did not, falls back to the heap."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scale_harness as h
import shardpoint as sp
from shardpoint import _core

N = 64
TOKEN = "order"


def _stats() -> tuple[int, int]:
    return _core.merge_order_stats()


def _rank_save(prefix: str, r: int, keys: list[str], step: int) -> None:
    # not durable: the merge order is what is tested, and 64 fsyncs a save made this slow
    with sp.Writer(
        prefix, rank=r, world_size=N, compression="none", merge_token=TOKEN, durable=False
    ) as w:
        for i, k in enumerate(keys):
            w.add(k, np.full(3, step * 1000 + r * 10 + i, dtype=np.float32))


def _layout(extra: dict[int, list[str]] | None = None) -> list[list[str]]:
    """DCP's layout in small: rank r holds ``t{j}@{r},0``, so all ranks' keys interleave."""
    keys = [[f"t{j:02d}@{r},0" for j in range(3)] for r in range(N)]
    for r, more in (extra or {}).items():
        keys[r] = more
    return keys


def _save_and_heap_merge(tmp: Path, prefix: str, layout: list[list[str]], step: int) -> bytes:
    """Every rank's partial for `layout`; the same partials copied aside and merged there
    (a prefix with nothing remembered: the heap); then the merge at `prefix`. Returns the
    heap's index bytes."""
    h._in_ranks(N, lambda r: _rank_save(prefix, r, layout[r], step))
    aside = tmp / f"aside-{step}"
    shutil.copytree(Path(prefix).parent, aside)
    sp.merge(str(aside / "ckpt"), N, token=TOKEN, durable=False)
    sp.merge(prefix, N, token=TOKEN, durable=False)
    sp.wait_for_cleanups()
    return (aside / "ckpt.index").read_bytes()


def test_unchanged_layout_merges_in_order_to_the_heaps_bytes(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    prefix = str(d / "ckpt")
    base = _stats()
    _save_and_heap_merge(tmp_path, prefix, _layout(), 1)
    assert _stats() == base, "nothing remembered at either prefix yet: both heap merges"
    heap = _save_and_heap_merge(tmp_path, prefix, _layout(), 2)
    assert _stats() == (base[0] + 1, base[1]), "same keys: merged in the remembered order"
    assert Path(prefix + ".index").read_bytes() == heap
    with sp.open(prefix) as rd:
        assert len(rd.keys()) == 3 * N
        assert rd["t01@17,0"].tolist() == [2171.0] * 3  # step 2's values


@pytest.mark.parametrize(
    "what,extra",
    [
        ("key added", {5: ["t00@5,0", "t00@5,0a", "t01@5,0", "t02@5,0"]}),
        # same entry counts, keys swapped between two ranks: the guess fails on its order check
        (
            "keys swapped",
            {5: ["t00@5,0", "t01@5,0", "t02@9,0"], 9: ["t00@9,0", "t01@9,0", "t02@5,0"]},
        ),
    ],
)
def test_changed_layout_falls_back_to_the_heap(
    tmp_path: Path, what: str, extra: dict[int, list[str]]
) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    prefix = str(d / "ckpt")
    _save_and_heap_merge(tmp_path, prefix, _layout(), 1)
    base = _stats()
    heap = _save_and_heap_merge(tmp_path, prefix, _layout(extra), 2)
    assert _stats() == (base[0], base[1] + 1), f"{what}: the remembered order did not fit"
    assert Path(prefix + ".index").read_bytes() == heap
    # the new layout is remembered: the next save of it merges in order
    heap = _save_and_heap_merge(tmp_path, prefix, _layout(extra), 3)
    assert _stats() == (base[0] + 1, base[1] + 1)
    assert Path(prefix + ".index").read_bytes() == heap


def test_duplicate_key_with_fitting_counts_is_refused(tmp_path: Path) -> None:
    """Rank 9 writes rank 5's key in place of one of its own: the counts fit the remembered
    order, the merge still refuses the save naming both ranks, and nothing is committed."""
    d = tmp_path / "ck"
    d.mkdir()
    prefix = str(d / "ckpt")
    _save_and_heap_merge(tmp_path, prefix, _layout(), 1)
    before = Path(prefix + ".index").read_bytes()
    layout = _layout({9: ["t00@9,0", "t01@5,0", "t02@9,0"]})
    h._in_ranks(N, lambda r: _rank_save(prefix, r, layout[r], 2))
    with pytest.raises(sp.DuplicateKeyError, match="rank 5 and rank 9"):
        sp.merge(prefix, N, token=TOKEN, durable=False)
    assert Path(prefix + ".index").read_bytes() == before


def test_unchanged_dcp_save_commits_the_heaps_index(tmp_path: Path, monkeypatch: Any) -> None:
    """Through DCP with our planner and StorageWriter (the harness at N = 64): the save whose
    plan was cached merges in order, and its index is the one a heap merge of the same
    partials (copied aside before the merge) builds."""
    from shardpoint.torch import dcp as dcp_module

    d = tmp_path / "ck"
    d.mkdir()
    prefix = str(d / "ckpt")
    first = h.dcp_save(prefix, N, tensors=2, planner="ours")
    real = dcp_module.storage.merge
    aside = tmp_path / "aside"

    def copy_then_merge(*a: Any, **k: Any) -> None:
        shutil.copytree(d, aside)
        real(*a, **k)

    monkeypatch.setattr(dcp_module.storage, "merge", copy_then_merge)
    base = _stats()
    h.dcp_save(prefix, N, tensors=2, planner="ours", previous=first)
    assert _stats() == (base[0] + 1, base[1])
    sp.wait_for_cleanups()
    real(str(aside / "ckpt"), N + 1)  # every rank's partial and the coordinator's
    assert Path(prefix + ".index").read_bytes() == (aside / "ckpt.index").read_bytes()
