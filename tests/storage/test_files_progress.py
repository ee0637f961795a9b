"""progress= on save_file / load_file: same results, and the bar sees every byte."""

from __future__ import annotations

import numpy as np

import shardpoint as sp
from shardpoint.storage import reader, save


class _Recorder:
    def __init__(self, total: float | None, desc: str) -> None:
        self.total, self.desc, self.done, self.closed = total, desc, 0, False

    def update(self, n: float = 1) -> None:
        self.done += n

    def close(self) -> None:
        self.closed = True


def test_progress_bars_cover_every_byte(tmp_path, monkeypatch):
    bars: list[_Recorder] = []

    def fake_bar(total, desc, **_kw):
        bars.append(_Recorder(total, desc))
        return bars[-1]

    monkeypatch.setattr(save, "progress_bar", fake_bar)
    monkeypatch.setattr(reader, "progress_bar", fake_bar)
    rng = np.random.default_rng(0)
    values = {f"t{i}": rng.standard_normal((64, 1024), dtype=np.float32) for i in range(40)}
    values["note"] = "text"
    p = str(tmp_path / "ck")
    sp.save_file(values, p, shards=2, progress=True, durable=False)
    total = sum(np.asarray(v).nbytes for v in values.values() if isinstance(v, np.ndarray)) + 4
    assert bars[0].desc == "save ck" and bars[0].total == total == bars[0].done and bars[0].closed
    got = sp.load_file(p, progress=True)
    assert bars[1].total == total == bars[1].done and bars[1].closed
    assert got.keys() == values.keys()
    for k, v in values.items():
        assert np.array_equal(got[k], v) if isinstance(v, np.ndarray) else got[k] == v
    with sp.open(p) as r:
        assert len(r.format_info["shards"]) == 2  # the streaming path kept both shard threads
        r.verify()


def test_progress_false_and_non_tty_draw_nothing(tmp_path, capsys):
    p = str(tmp_path / "ck")
    sp.save_file({"a": np.ones(1000)}, p, progress=False, durable=False)
    sp.load_file(p)  # progress=None and stderr is not a terminal under pytest
    assert capsys.readouterr().err == ""


def test_progress_does_not_change_the_shard_layout(tmp_path, monkeypatch):
    """One save algorithm: a progress bar only observes, the files come out the same."""
    monkeypatch.setattr(save, "progress_bar", lambda total, desc, **_kw: _Recorder(total, desc))
    rng = np.random.default_rng(1)
    values = {
        f"w{i:02d}": rng.standard_normal((17 * (i + 1), 256), dtype=np.float32) for i in range(24)
    }
    layouts = []
    for progress in (False, True):
        p = str(tmp_path / f"ck-{progress}")
        sp.save_file(values, p, shards=3, progress=progress, durable=False)
        with sp.open(p) as r:
            entries = {
                k: (r.info(k).shard, r.info(k).offset, r.info(k).stored_bytes) for k in r.keys()
            }
            sizes = [n for _, n in r.format_info["shards"]]
        layouts.append((entries, sizes))
    assert layouts[0] == layouts[1]
