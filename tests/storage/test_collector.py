"""``storage.collector.collector_paused``: the collector paused around building large kept
structures, its state restored exactly, overlapping pauses resumed by the last one out; and
the readers' bulk structures (a safetensors header's records, an index's metadata, the
weights iterator's plan) built with a few young collections, not a hundred."""

from __future__ import annotations

import gc
import os
import pathlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.storage.collector import collector_paused


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations of the collections run while the test runs."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


def test_paused_inside_and_restored_after_an_error() -> None:
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), collector_paused():
        assert not gc.isenabled()
        _ = 1 / 0
    assert gc.isenabled()


def test_an_application_pause_is_kept() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # not resumed: it was not ours to resume
    finally:
        gc.enable()


@contextmanager
def _paused_in_another_thread() -> Iterator[None]:
    """A pause held by another thread for the ``with`` block (ended, and the thread joined,
    on the way out)."""
    entered = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with collector_paused():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert entered.wait(10)
        yield
    finally:
        leave.set()
        t.join(10)


def test_overlapping_pauses_resume_when_the_last_one_leaves() -> None:
    with _paused_in_another_thread():
        with collector_paused():
            pass
        assert not gc.isenabled()  # the other thread's pause is still under way
    assert gc.isenabled()


def test_thousands_of_allocations_make_no_collection_inside(collections: list[int]) -> None:
    with collector_paused():
        kept = [[i] for i in range(50_000)]  # tracked objects, ~70 young collections' worth
        inside = list(collections)
    assert inside == []
    assert len(kept) == 50_000
    _ = [[i] for i in range(10)]  # resumed: the next allocations collect the young ones
    assert collections and 2 not in collections


def test_large_headers_and_indexes_are_read_without_a_collection(
    tmp_path: pathlib.Path, collections: list[int]
) -> None:
    """Opening a 20,000-tensor safetensors file and planning its load, and a shardpoint
    checkpoint's metadata with a section per tensor, run a few young collections (one as
    each pause ends) and never a full one: 85 + 54 young ones before the pauses, and a full
    one (~0.1 s with torch imported) every ~110 of them."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import shardpoint.torch as sptorch
    from shardpoint.torch.weights_plan import Plan

    state = {f"layer.{i}.w": torch.full((4,), float(i)) for i in range(20_000)}
    safetensors_torch.save_file(state, str(tmp_path / "m.safetensors"))
    sptorch.save(state, str(tmp_path / "ck"), compression=None)
    for path in (str(tmp_path / "m.safetensors"), str(tmp_path / "ck")):
        gc.collect()  # counts from zero: a full collection needs 100 young ones from here
        collections.clear()
        reader = sp.open(path)
        plan = Plan(reader, None)
        assert len(plan.infos) == 20_000
        assert len(collections) <= 4 and 2 not in collections, (path, collections)
        assert np.array_equal(reader["layer.19999.w"], np.full(4, 19999, np.float32))
        reader.close()


def test_a_child_forked_during_another_threads_pause_collects() -> None:
    """A data loader forking while the weights iterator's thread builds a batch: the child
    starts with the collector running (no thread there would ever resume it) and its own
    pauses work."""
    with _paused_in_another_thread():
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            ok = gc.isenabled()
            with collector_paused():
                ok = ok and not gc.isenabled()
            os._exit(0 if ok and gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not gc.isenabled()  # the parent's pause is still under way
    assert gc.isenabled()
