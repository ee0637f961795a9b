"""Asynchronous and incremental saves on the storage face (issue 13): ``save_file(blocking=False)``,
the ``AsyncSaver`` rules (snapshot, order, in-flight bound, errors, exit) and ``save_file(base=)``."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

import shardpoint as sp
from shardpoint import _core
from shardpoint.storage.async_save import AsyncSaver, SaveFuture, StagingBuffers, default_saver


def _state(seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB: two chunks
    return {
        "big": big,
        "strided": rng.integers(0, 1 << 30, (64, 64), dtype=np.int64)[:, ::2],
        "half": rng.standard_normal(300).astype(np.float16),
        "scalar": np.float64(3.5),
        "step": 7,
        "name": "run",
        "cfg": {"lr": 0.1},
    }


def _equal(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) or isinstance(a, np.generic):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    return bool(a == b)


# ---- save_file(blocking=False) ----------------------------------------------------------------


def test_nonblocking_save_returns_future_and_snapshots(tmp_path):
    state = _state()
    want = copy.deepcopy(state)
    fut = sp.save_file(state, tmp_path / "c", blocking=False)
    assert isinstance(fut, Future) and isinstance(fut, SaveFuture)
    # Mutate everything in place right away: the checkpoint must hold the values of the call.
    for v in state.values():
        if isinstance(v, np.ndarray):
            v[...] = 0
    state["cfg"]["lr"] = 99.0  # type: ignore[index]
    assert fut.result(timeout=60) is None
    assert fut.done() and fut.exception() is None
    got = sp.load_file(tmp_path / "c")
    assert set(got) == set(want)
    for k in want:
        w = np.asarray(want[k]) if isinstance(want[k], np.generic) else want[k]
        assert _equal(got[k], w), k


def test_done_callback_and_blocking_default(tmp_path):
    seen: list[object] = []
    fut = sp.save_file({"x": np.arange(10)}, tmp_path / "a", blocking=False)
    fut.add_done_callback(lambda f: seen.append(f.result()))
    fut.result(timeout=60)
    deadline = time.time() + 10
    while not seen and time.time() < deadline:
        time.sleep(0.01)
    assert seen == [None]
    assert sp.save_file({"x": np.arange(10)}, tmp_path / "b") is None
    assert sp.exists(tmp_path / "b")


def test_saves_to_one_prefix_commit_in_call_order(tmp_path):
    x = np.zeros(1 << 18, dtype=np.float32)
    futs = []
    for i in range(6):
        x[:] = i
        futs.append(sp.save_file({"x": x, "i": i}, tmp_path / "c", blocking=False))
    for f in futs:
        f.result(timeout=120)
    got = sp.load_file(tmp_path / "c")
    assert got["i"] == 5 and (got["x"] == 5).all()


def test_argument_errors_raise_in_the_call(tmp_path):
    with pytest.raises(sp.InvalidArgumentError):
        sp.save_file({"x": np.arange(3)}, tmp_path / "c", compression="lz4", blocking=False)
    with pytest.raises(sp.InvalidKeyError):
        sp.save_file({"": np.arange(3)}, tmp_path / "c", blocking=False)
    default_saver().wait(60)


# ---- staging ------------------------------------------------------------------------------------


def test_stage_copy_copies_and_crcs_match_the_index(tmp_path):
    state = {"a": np.arange(3_000_000, dtype=np.float32), "b": np.arange(5, dtype=np.int8)}
    sp.save_file(state, tmp_path / "c")
    bufs = StagingBuffers()
    items = [("a", "float32", "tensor", (3_000_000,), state["a"].view(np.uint8))]
    items.append(("b", "int8", "tensor", (5,), state["b"].view(np.uint8)))
    staged, crcs = bufs.stage(items, with_crc=True)
    assert staged[0][4].tobytes() == state["a"].tobytes()
    assert staged[1][4].tobytes() == state["b"].tobytes()
    with sp.open(tmp_path / "c") as r:
        assert crcs == [r.info("a").crc32c, r.info("b").crc32c]


def test_stage_copy_refuses_bad_destinations():
    src = np.arange(8, dtype=np.uint8)
    with pytest.raises(ValueError, match="8 bytes, destination 4"):
        _core.stage_copy([src], [np.empty(4, np.uint8)], False)
    ro = np.empty(8, np.uint8)
    ro.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        _core.stage_copy([src], [ro], False)
    whole = np.empty(16, np.uint8)
    with pytest.raises(ValueError, match="overlap"):
        _core.stage_copy([src, src], [whole[:8], whole[4:12]], False)


def test_warm_saver_allocates_nothing_new(tmp_path):
    saver = AsyncSaver()
    sets: list[StagingBuffers] = []

    def new_buffers() -> StagingBuffers:
        b = StagingBuffers()
        sets.append(b)
        return b

    x = np.zeros((256, 1024), np.float32)
    for i in range(5):
        x[:] = i

        def stage(bufs: StagingBuffers, i: int = i) -> object:
            copy, _ = bufs.stage(
                [("x", "float32", "tensor", x.shape, x.view(np.uint8).reshape(-1))], with_crc=False
            )
            return lambda: sp.save_file({"x": copy[0][4].view(np.float32)}, tmp_path / f"c{i}")

        saver.submit(stage, new_buffers=new_buffers)
    saver.wait(60)
    assert len(sets) == 1 and sets[0].allocations == 1  # one set, one buffer, five saves
    assert all((sp.load_file(tmp_path / f"c{i}")["x"] == i).all() for i in range(5))


# ---- the saver's rules ----------------------------------------------------------------------------


def _gated_saver(max_in_flight: int) -> tuple[AsyncSaver, threading.Event, list[int]]:
    saver = AsyncSaver(max_in_flight=max_in_flight)
    gate = threading.Event()
    order: list[int] = []
    return saver, gate, order


def _job(gate: threading.Event, order: list[int], i: int, fail: bool = False):
    def stage(_bufs: object):
        def write() -> int:
            gate.wait(30)
            order.append(i)
            if fail:
                raise OSError(f"disk full in save {i}")
            return i

        return write

    return stage


def test_at_most_max_in_flight_and_call_order():
    saver, gate, order = _gated_saver(2)
    f0 = saver.submit(_job(gate, order, 0))
    f1 = saver.submit(_job(gate, order, 1))
    assert saver.in_flight == 2
    third: list[SaveFuture] = []
    t = threading.Thread(target=lambda: third.append(saver.submit(_job(gate, order, 2))))
    t.start()
    time.sleep(0.3)
    assert not third, "a third save must wait while two are in flight"
    gate.set()
    t.join(30)
    assert [f.result(30) for f in (f0, f1, third[0])] == [0, 1, 2]
    assert order == [0, 1, 2]
    saver.wait(30)
    assert saver.in_flight == 0


def test_error_surfaces_on_result():
    saver, gate, order = _gated_saver(1)
    gate.set()
    f = saver.submit(_job(gate, order, 0, fail=True))
    with pytest.raises(OSError, match="disk full in save 0"):
        f.result(30)
    saver.wait(30)  # observed on result(): not raised again
    assert saver.submit(_job(gate, order, 1)).result(30) == 1


def test_unobserved_error_surfaces_on_next_save_and_once():
    saver, gate, order = _gated_saver(1)
    gate.set()
    f = saver.submit(_job(gate, order, 0, fail=True))
    while not f.done():
        time.sleep(0.01)
    with pytest.raises(OSError, match="save 0"):
        saver.submit(_job(gate, order, 1))
    assert order == [0], "the save that raised did not start"
    assert saver.submit(_job(gate, order, 2)).result(30) == 2


def test_unobserved_error_surfaces_on_wait():
    saver, gate, order = _gated_saver(1)
    saver.submit(_job(gate, order, 0, fail=True))
    gate.set()
    with pytest.raises(OSError, match="save 0"):
        saver.wait(30)
    saver.wait(30)


def test_wait_timeout():
    saver, gate, order = _gated_saver(1)
    saver.submit(_job(gate, order, 0))
    with pytest.raises(TimeoutError, match="still in flight"):
        saver.wait(0.2)
    gate.set()
    saver.wait(30)


def test_failing_stage_frees_its_slot():
    saver = AsyncSaver(max_in_flight=1)

    def bad(_b: object):
        raise ValueError("cannot stage")

    with pytest.raises(ValueError):
        saver.submit(bad)
    assert saver.in_flight == 0
    assert saver.submit(lambda _b: lambda: 5).result(30) == 5


def test_interpreter_waits_for_saves_at_exit(tmp_path):
    code = (
        "import numpy as np, shardpoint as sp\n"
        "x = np.random.default_rng(0).standard_normal(8_000_000).astype(np.float32)\n"
        f"sp.save_file({{'x': x}}, {str(tmp_path / 'c')!r}, blocking=False)\n"
        "x[:] = 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    got = sp.load_file(tmp_path / "c")["x"]
    want = np.random.default_rng(0).standard_normal(8_000_000).astype(np.float32)
    assert np.array_equal(got, want)


# ---- incremental saves (save_file(base=)) --------------------------------------------------------


def _frozen_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "base/w1": rng.standard_normal((1024, 1024)).astype(np.float32),  # 4 MiB: own shard
        "base/w2": rng.standard_normal((1024, 1280)).astype(np.float32),
        "lora/a": rng.standard_normal((64, 1024)).astype(np.float32),
        "lora/b": np.zeros((1024, 64), np.float32),
    }


def _shard_inodes(prefix: str) -> dict[int, int]:
    d, base = os.path.split(prefix)
    out = {}
    for n in os.listdir(d):
        if n.startswith(base + ".data-"):
            st = os.stat(os.path.join(d, n))
            out[st.st_ino] = st.st_size
    return out


def test_incremental_links_unchanged_values_only(tmp_path):
    s = _frozen_state()
    p1, p2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    sp.save_file(s, p1, incremental=True)
    s["lora/b"] += 1.0
    sp.save_file(s, p2, base=p1)
    shared = set(_shard_inodes(p1)) & set(_shard_inodes(p2))
    assert len(shared) >= 2, "both frozen matrices re-used"
    got = sp.load_file(p2)
    assert all(np.array_equal(got[k], s[k]) for k in s)
    with sp.open(p2) as r:
        r.verify()
        inc = r.format_info["incremental"]
        assert inc["base"] == "c1" and inc["linked_shards"] == len(shared)
        assert inc["linked_bytes"] == s["base/w1"].nbytes + s["base/w2"].nbytes


def test_incremental_never_trusts_identity(tmp_path):
    s = _frozen_state()
    p1, p2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    sp.save_file(s, p1, incremental=True)
    s["base/w1"][17, 3] += 1.0  # same object, same shape: one value changed in place
    sp.save_file(s, p2, base=p1)
    assert np.array_equal(sp.load_file(p2)["base/w1"], s["base/w1"])
    with sp.open(p2) as r:  # w2 and the small values re-used, w1 written again
        linked = r.format_info["incremental"]["linked_bytes"]
    assert linked == sum(v.nbytes for v in s.values()) - s["base/w1"].nbytes


def test_incremental_same_bytes_other_shape_or_dtype_is_rewritten(tmp_path):
    s = _frozen_state()
    p1, p2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    sp.save_file(s, p1, incremental=True)
    s2 = dict(s)
    s2["base/w1"] = s["base/w1"].reshape(2048, 512)  # identical bytes, other shape
    s2["base/w2"] = s["base/w2"].view(np.int32)  # identical bytes, other dtype
    sp.save_file(s2, p2, base=p1)
    got = sp.load_file(p2)
    assert got["base/w1"].shape == (2048, 512) and got["base/w2"].dtype == np.int32
    with sp.open(p2) as r:
        # Only the untouched small values (packed in one shard) are re-used.
        assert (
            r.format_info["incremental"]["linked_bytes"] == s["lora/a"].nbytes + s["lora/b"].nbytes
        )


def test_deleting_the_base_keeps_the_newer_checkpoint(tmp_path):
    s = _frozen_state()
    p1, p2, p3 = (str(tmp_path / f"c{i}") for i in (1, 2, 3))
    sp.save_file(s, p1, incremental=True)
    sp.save_file(s, p2, base=p1)
    with sp.open(p2) as r:
        assert r.format_info["incremental"]["linked_bytes"] == sum(v.nbytes for v in s.values())
    sp.remove(p1)
    sp.save_file(s, p3, base=p2)
    sp.remove(p2)
    got = sp.load_file(p3)
    assert all(np.array_equal(got[k], s[k]) for k in s)
    with sp.open(p3) as r:
        r.verify()


def test_incremental_base_missing_or_unusable_falls_back_to_full(tmp_path):
    s = _frozen_state()
    sp.save_file(s, tmp_path / "c", base=tmp_path / "nothing-here")
    assert all(np.array_equal(sp.load_file(tmp_path / "c")[k], s[k]) for k in s)
    with sp.open(tmp_path / "c") as r:
        assert r.format_info["incremental"]["linked_shards"] == 0
    # Other chunk size: chunk tables cannot be shared, everything is written.
    sp.save_file(s, tmp_path / "d", base=tmp_path / "c", chunk_bytes=1 << 16)
    with sp.open(tmp_path / "d") as r:
        assert r.format_info["incremental"]["linked_shards"] == 0
        r.verify()


def test_incremental_base_shard_replaced_falls_back(tmp_path):
    s = _frozen_state()
    p1, p2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    sp.save_file(s, p1, incremental=True)
    # Swap one of the base's shards for another file: linking must notice and write afresh.
    names = sorted(n for n in os.listdir(tmp_path) if n.startswith("c1.data-"))
    victim = tmp_path / names[0]
    data = victim.read_bytes()
    victim.unlink()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]) + b"\0" * 64)
    sp.save_file(s, p2, base=p1)
    got = sp.load_file(p2)
    assert all(np.array_equal(got[k], s[k]) for k in s)
    with sp.open(p2) as r:
        r.verify()
        assert "base" in r.format_info["incremental"]


def test_incremental_async_uses_staging_crcs(tmp_path):
    s = _frozen_state()
    p1, p2 = str(tmp_path / "c1"), str(tmp_path / "c2")
    sp.save_file(s, p1, incremental=True, blocking=False).result(60)
    f = sp.save_file(s, p2, base=p1, blocking=False)
    for v in s.values():
        v[...] = -1  # snapshot: the links must be decided on the values of the call
    f.result(60)
    got = sp.load_file(p2)
    assert all(np.array_equal(got[k], sp.load_file(p1)[k]) for k in got)
    with sp.open(p2) as r:
        assert r.format_info["incremental"]["linked_shards"] >= 3


def test_incremental_save_over_its_own_base(tmp_path):
    s = _frozen_state()
    p = str(tmp_path / "c")
    sp.save_file(s, p, incremental=True)
    s["lora/b"] += 2.0
    sp.save_file(s, p, base=p)  # the base's names are taken: links get the tokened names
    got = sp.load_file(p)
    assert all(np.array_equal(got[k], s[k]) for k in s)
    with sp.open(p) as r:
        r.verify()
        assert r.format_info["incremental"]["linked_bytes"] >= s["base/w1"].nbytes
        nshards = len(r.format_info["shards"])
    assert len([n for n in os.listdir(tmp_path) if ".data-" in n]) == nshards  # old names gone


def test_empty_incremental_save(tmp_path):
    sp.save_file({}, tmp_path / "e", incremental=True)
    assert sp.load_file(tmp_path / "e") == {}
    sp.save_file({"s": "x"}, tmp_path / "f", base=tmp_path / "e")
    assert sp.load_file(tmp_path / "f") == {"s": "x"}


def test_saver_after_fork_starts_clean():
    # In a fresh interpreter: forking this pytest process (other libraries' threads) could
    # deadlock for reasons unrelated to the saver.
    code = """
import os, threading
from shardpoint.storage.async_save import AsyncSaver
saver = AsyncSaver()
gate = threading.Event()
saver.submit(lambda _b: lambda: gate.wait(30))  # in flight while we fork
pid = os.fork()
if pid == 0:  # child: the parent's job is not ours; a new save must not wait for it
    ok = saver.submit(lambda _b: lambda: 7).result(20) == 7 and saver.in_flight == 0
    os._exit(0 if ok else 1)
gate.set()
_, status = os.waitpid(pid, 0)
saver.wait(30)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    r = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
