"""``weights_iterator(consumer_threads=1)``: the consuming thread runs torch on one intra-op
thread while it takes values, and gets its own count back, exactly, when the iterator ends, is
closed, raises, or is dropped (``shardpoint/torch/consumer_threads.py``).

The thread count is process state a later line of the user's script reads, so every scenario
runs in one fresh interpreter (``_CHILD``) that sets its own count first (3: not the machine's
default, so a restore to "the default" instead of the user's value would show), and reports
what it saw as JSON."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
import shardpoint.torch as sptorch  # noqa: E402
from shardpoint.torch.weights import loader_options  # noqa: E402

_CHILD = r"""
import json, sys, threading
import torch
import shardpoint as sp
import shardpoint.torch as sptorch

ck, damaged = sys.argv[1], sys.argv[2]
want = sp.load_file(ck)
torch.set_num_threads(3)
out = {}

def inside_and_after(**kw):
    seen = set()
    exact = True
    for name, t in sptorch.weights_iterator(ck, **kw):
        seen.add(torch.get_num_threads())
        exact &= t.numpy().tobytes() == want[name].tobytes()
    return sorted(seen), torch.get_num_threads(), exact

out["exhausted"] = inside_and_after()
out["opt_out"] = inside_and_after(consumer_threads=None)
out["two"] = inside_and_after(consumer_threads=2)

it = sptorch.weights_iterator(ck)
next(it)
during = torch.get_num_threads()
it.close()
out["closed"] = [during, torch.get_num_threads()]

with sptorch.weights_iterator(ck) as it:
    next(it)
    during = torch.get_num_threads()
out["with_block"] = [during, torch.get_num_threads()]

for name, t in sptorch.weights_iterator(ck):
    during = torch.get_num_threads()
    break  # the iterator is dropped here: its __del__ closes it
out["break"] = [during, torch.get_num_threads()]

err = None
try:
    for name, t in sptorch.weights_iterator(damaged):
        during = torch.get_num_threads()
except sp.ChecksumMismatchError as e:
    err = str(e)
out["raised"] = [during, torch.get_num_threads(), err]

# closed from another thread: the consumer's own count comes back at its next call
it = sptorch.weights_iterator(ck)
next(it)
th = threading.Thread(target=it.close)
th.start(); th.join()
during = torch.get_num_threads()
ended = False
try:
    next(it)
except StopIteration:
    ended = True
out["closed_elsewhere"] = [during, torch.get_num_threads(), ended]

# a thread that never iterates keeps its own count while another thread consumes
seen_other = []
it = sptorch.weights_iterator(ck)
next(it)
th = threading.Thread(target=lambda: seen_other.append(torch.get_num_threads()))
th.start(); th.join()
it.close()
out["other_thread"] = seen_other

torch.set_num_threads(1)
out["already_one"] = inside_and_after(consumer_threads=2)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    d = tmp_path_factory.mktemp("threads")
    g = torch.Generator().manual_seed(3)
    state = {f"layers.{i}.weight": torch.randn(256, 300, generator=g) for i in range(6)}
    state["norm"] = torch.randn(17, generator=g)
    sptorch.save(state, str(d / "ck"), compression="none")
    sptorch.save(state, str(d / "bad"), compression="none")
    with sp.open(str(d / "bad")) as r:
        info = r.info("layers.4.weight")
        shard = pathlib.Path(r.format_info["shards"][info.shard][0])
    with open(shard, "r+b") as f:  # one flipped bit inside layers.4.weight
        f.seek(info.offset + 1000)
        b = f.read(1)
        f.seek(info.offset + 1000)
        f.write(bytes([b[0] ^ 0x04]))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(d / "ck"), str(d / "bad")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_one_thread_while_consumed_and_restored_after_the_end(child: dict[str, list]) -> None:
    seen, after, exact = child["exhausted"]
    assert seen == [1] and after == 3
    assert exact  # bit for bit what load_file reads


def test_opt_out_and_other_limits(child: dict[str, list]) -> None:
    assert child["opt_out"] == [[3], 3, True]  # None: torch's setting untouched
    assert child["two"] == [[2], 3, True]
    # a count already at or below the limit is left alone (never raised)
    assert child["already_one"] == [[1], 1, True]


def test_restored_on_close_with_block_and_break(child: dict[str, list]) -> None:
    assert child["closed"] == [1, 3]
    assert child["with_block"] == [1, 3]
    assert child["break"] == [1, 3]


def test_restored_when_the_iterator_raises(child: dict[str, list]) -> None:
    during, after, err = child["raised"]
    assert during == 1 and after == 3
    assert err is not None and "layers.4.weight" in err


def test_close_from_another_thread(child: dict[str, list]) -> None:
    # the count is the consumer thread's: another thread's close cannot reach it; the
    # consumer's next call ends the iteration and gives it back
    during, after, ended = child["closed_elsewhere"]
    assert during == 1 and after == 3 and ended


def test_other_threads_keep_their_count(child: dict[str, list]) -> None:
    assert child["other_thread"] and child["other_thread"][0] != 1


def test_bad_values_refused(tmp_path: pathlib.Path) -> None:
    sptorch.save({"w": torch.ones(3)}, str(tmp_path / "ck"))
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(sp.InvalidArgumentError, match="consumer_threads"):
            sptorch.weights_iterator(str(tmp_path / "ck"), consumer_threads=bad)  # type: ignore[arg-type]
    assert loader_options({"consumer_threads": None}, "x") == {"consumer_threads": None}
    assert loader_options({"consumer_threads": 2}, "x") == {"consumer_threads": 2}
    with pytest.raises(ValueError, match="consumer_threads"):
        loader_options({"consumer_threads": 0}, "x")


def test_setter_is_the_openmp_runtime_or_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardpoint.torch import consumer_threads as ct

    if "OpenMP" in torch.__config__.parallel_info():
        # torch's own runtime is found and checked (per-thread, not the process-wide default)
        assert ct._omp_runtime() is not None
        assert ct._omp_setter() is not None
    monkeypatch.setattr(ct, "_setter", [])
    monkeypatch.setattr(ct, "_omp_runtime", lambda: None)
    assert ct.thread_setter() is torch.set_num_threads  # no runtime found: torch's own call
