"""``weights_iterator(direct="auto")``: the route of a large local read (buffered with the
read-ahead, or the ``O_DIRECT`` cold-read engine) timed on the first values, the faster kept
(python/shardpoint/torch/weights_route.py).

The thresholds are lowered for these tests (``AUTO_MIN``, ``PROBE``: module constants the
iterator reads when it starts) so that a 40 MiB file is probed; the files are real, evicted
from the page cache first, and every value is compared with what was saved."""

from __future__ import annotations

import os
import pathlib
import time

import numpy as np
import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import shardpoint.torch as sptorch  # noqa: E402
import shardpoint.torch.weights as weights  # noqa: E402
import shardpoint.torch.weights_route as weights_route  # noqa: E402
from page_cache import evict, takes_o_direct  # noqa: E402
from shardpoint.storage.io_mode import cached_fraction  # noqa: E402
from shardpoint.torch.weights_options import loader_options  # noqa: E402
from shardpoint.torch.weights_route import RouteProbe  # noqa: E402

MIB = 1 << 20


def _state(n: int = 40) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    # 1 MiB each (bf16 256 x 2048), plus small ones between them
    out: dict[str, torch.Tensor] = {}
    for i in range(n):
        out[f"layer.{i:03d}.weight"] = torch.randn(256, 2048, generator=g).to(torch.bfloat16)
        out[f"layer.{i:03d}.bias"] = torch.randn(2048, generator=g)
    return out


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights, "AUTO_MIN", 16 * MIB)
    monkeypatch.setattr(weights_route, "PROBE", 4 * MIB)


@pytest.fixture(params=["hf", "shardpoint", "shardpoint-default-codec"])
def checkpoint(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> tuple[str, dict]:
    state = _state()
    if request.param == "hf":
        d = tmp_path / "model"
        d.mkdir()
        safetensors_torch.save_file(state, str(d / "model.safetensors"))
        path, files = str(d), [d / "model.safetensors"]
    else:
        path = str(tmp_path / "ck")
        if request.param == "shardpoint":
            sptorch.save(state, path, compression="none")
        else:  # compressed values: the direct route decodes from the engine's buffers
            sptorch.save(state, path)
        files = [p for p in tmp_path.iterdir() if p.name.startswith("ck.")]
    evict(*files)
    return path, state


def _files(path: str) -> list[pathlib.Path]:
    """The files of the checkpoint at ``path`` (a Hugging Face directory or a prefix)."""
    p = pathlib.Path(path)
    return list(p.iterdir()) if p.is_dir() else list(p.parent.glob(p.name + ".*"))


def _cold(path: str) -> None:
    """Evict the checkpoint's files until ``mincore`` shows them out of the page cache: under
    the suite's parallel load the kernel once kept a file just evicted (a route test then
    tests the kernel, not the route)."""
    for _ in range(5):
        evict(*_files(path))
        if all(cached_fraction(str(f)) < 0.5 for f in _files(path)):
            return
        time.sleep(0.2)
    pytest.fail(f"{path}: the kernel keeps these files in the page cache after 5 evictions")


def _read_all(it: sptorch.WeightsIterator) -> dict[str, torch.Tensor]:
    with it:
        return dict(it)


def _same(got: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(state)
    for k, v in state.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k


@pytest.mark.usefixtures("small_thresholds")
def test_auto_times_both_routes_and_keeps_the_faster(checkpoint: tuple[str, dict]) -> None:
    path, state = checkpoint
    # an 8 MiB window makes 4 MiB batches (a few per route)
    it = sptorch.weights_iterator(path, window=8 * MIB, direct="auto")
    assert it.route == "probing: direct"
    got = _read_all(it)
    _same(got, state)
    rates = it.probe_rates
    assert set(rates) == {"direct", "buffered"} and min(rates.values()) > 0, rates
    clearly = rates["direct"] >= weights_route.DIRECT_MARGIN * rates["buffered"]
    assert it.route == ("direct" if clearly else "buffered")


@pytest.mark.usefixtures("small_thresholds")
@pytest.mark.parametrize("kept", ["direct", "buffered"])
def test_each_choice_reads_the_rest_by_its_route(
    checkpoint: tuple[str, dict], kept: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever route is kept, every value arrives exact; after a direct choice the
    read-ahead thread is stopped, after a buffered one it keeps reading ahead."""
    path, state = checkpoint
    monkeypatch.setattr(RouteProbe, "_choose", lambda self: kept)
    it = sptorch.weights_iterator(path, window=8 * MIB, direct="auto")
    _same(_read_all(it), state)
    assert it.route == kept
    # a direct choice dropped the read-ahead; a buffered one kept it to the end
    assert (it._p._ahead is None) == (kept == "direct")


@pytest.mark.usefixtures("small_thresholds")
def test_the_window_bounds_memory_while_probing(checkpoint: tuple[str, dict]) -> None:
    path, state = checkpoint
    window = 6 * MIB
    it = sptorch.weights_iterator(path, window=window, direct="auto")
    peak = 0
    with it:
        for _name, _t in it:
            peak = max(peak, it._inflight)
    assert 0 < peak <= window
    assert set(it.probe_rates) == {"direct", "buffered"}


def test_small_warm_and_mmap_reads_are_not_probed(
    checkpoint: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under AUTO_MIN (512 MiB; these files are 40 MiB), with io="mmap", and for a file in
    the page cache nothing is timed: the buffered route; by default, no probe either."""
    path, state = checkpoint
    for kw in ({"direct": "auto"}, {"direct": "auto", "io": "mmap"}, {}):
        it = sptorch.weights_iterator(path, **kw)  # type: ignore[arg-type]
        _same(_read_all(it), state)
        assert it.route == "buffered" and it.probe_rates == {}
    monkeypatch.setattr(weights, "AUTO_MIN", 16 * MIB)
    it = sptorch.weights_iterator(path, direct="auto")  # warm now: read just above
    _same(_read_all(it), state)
    assert it.route == "buffered" and it.probe_rates == {}


@pytest.mark.usefixtures("small_thresholds")
def test_cold_reads_a_cold_file_direct_and_a_cached_one_buffered(
    checkpoint: tuple[str, dict],
) -> None:
    """The default, ``direct="cold"``: a large read whose files are not in the page cache
    takes the cold-read engine with no probe; once the files are cached, the buffered route;
    ``direct=False`` is buffered whatever the cache holds. Every value is what was saved, and
    a compressed checkpoint takes the same routes as the others (however much memory is
    free)."""
    path, state = checkpoint
    for kw in ({}, {"direct": "cold"}):
        # evicted before each pass: under the suite's load a file just evicted was once still
        # cached, and a file was found cached whole after a direct pass (docs/SERVING.md,
        # "Issue 41 (thirteenth round)"); the route decision is what is tested here
        _cold(path)
        it = sptorch.weights_iterator(path, window=8 * MIB, **kw)  # type: ignore[arg-type]
        assert it.route == "direct"
        _same(_read_all(it), state)
        assert it.route == "direct" and it.probe_rates == {}
    it = sptorch.weights_iterator(path, window=8 * MIB, direct=False)
    _same(_read_all(it), state)
    assert it.route == "buffered"
    for f in _files(path):
        f.read_bytes()  # into the page cache
    it = sptorch.weights_iterator(path, window=8 * MIB)
    _same(_read_all(it), state)
    assert it.route == "buffered" and it.probe_rates == {}


@pytest.mark.usefixtures("small_thresholds")
def test_a_load_judged_cold_reads_its_cached_pieces_from_the_device_too(
    tmp_path: pathlib.Path,
) -> None:
    """A ``pread`` of cached pages the kernel's read-ahead marked starts the read-ahead of the
    next ones; when the disk reads ahead as much as the engine's 8 MiB piece, each next piece
    then looks cached, and a "direct" cold load ran buffered through the whole file (3-6 in
    30 under a concurrent write, docs/SERVING.md, fifteenth round). So ``direct="cold"``
    reads even the pieces it finds cached from the device; ``direct=True`` follows the
    cache. Here the first 16 MiB of a cold 40 MiB file are cached by a buffered read, as a
    header read's read-ahead would leave them."""
    state = _state()
    d = tmp_path / "model"
    d.mkdir()
    f = d / "model.safetensors"
    safetensors_torch.save_file(state, str(f))
    kinds = {}
    for direct in ("cold", True):
        _cold(str(d))
        fd = os.open(f, os.O_RDONLY)
        try:  # no read-ahead past them (the file stays mostly cold: the direct route)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            assert len(os.pread(fd, 16 * MIB, 0)) == 16 * MIB
        finally:
            os.close(fd)
        it = sptorch.weights_iterator(str(d), window=8 * MIB, direct=direct)
        assert it.route == "direct"
        _same(_read_all(it), state)
        kinds[direct] = it._reader.read_kinds  # (in place, bounced, from the page cache)
    if takes_o_direct(f):
        assert kinds["cold"][2] == 0, kinds
        # the two whole cached pieces and more came from the cache when following it
        assert kinds[True][2] >= 8 * MIB, kinds
    assert sum(kinds["cold"]) == sum(kinds[True])


@pytest.mark.usefixtures("small_thresholds")
def test_cold_keeps_buffered_for_mmap_and_small_reads(
    checkpoint: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, state = checkpoint
    it = sptorch.weights_iterator(path, io="mmap", direct="cold")
    _same(_read_all(it), state)
    assert it.route == "buffered"
    evict(*_files(path))
    monkeypatch.setattr(weights, "AUTO_MIN", 1 << 40)  # the read is now "small"
    it = sptorch.weights_iterator(path, direct="cold")
    _same(_read_all(it), state)
    assert it.route == "buffered"


def test_mostly_cached_samples_the_page_cache(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(np.random.default_rng(1).bytes(16 * MIB))
    spans = [(0, k * MIB, MIB) for k in range(16)]
    evict(f)
    assert not weights_route.mostly_cached(([str(f)], spans))
    with open(f, "rb") as fh:
        fh.read(9 * MIB)  # more than half of the bytes the spans read
    assert weights_route.mostly_cached(([str(f)], spans))
    assert not weights_route.mostly_cached(None)


def test_forced_routes_and_bad_values(checkpoint: tuple[str, dict]) -> None:
    path, state = checkpoint
    for direct, route in ((True, "direct"), (False, "buffered")):
        it = sptorch.weights_iterator(path, direct=direct)
        _same(_read_all(it), state)
        assert it.route == route and it.probe_rates == {}
    for bad in ("yes", 1, None):
        with pytest.raises(
            sp.InvalidArgumentError, match="direct must be True, False, 'cold' or 'auto'"
        ):
            sptorch.weights_iterator(path, direct=bad)  # type: ignore[arg-type]


def test_loader_option_accepts_auto_and_cold() -> None:
    assert loader_options({"direct": "auto"}, "x") == {"direct": "auto"}
    assert loader_options({"direct": "cold"}, "x") == {"direct": "cold"}
    with pytest.raises(ValueError, match='x: direct must be true, false, "cold" or "auto"'):
        loader_options({"direct": "fast"}, "x")


def test_probe_phases() -> None:
    """The first batch of each route is not timed; direct is timed first, then buffered;
    direct is kept only at the margin, and later records change nothing."""
    p = RouteProbe(10)
    assert p.record("direct", 8, 1.0) is None  # ramp-up: untimed
    assert p.record("buffered", 8, 1.0) is None  # not the route being timed: ignored
    assert p.record("direct", 6, 1.0) is None
    assert p.record("direct", 6, 1.0) == "buffered"  # 12 bytes in 2 s
    assert p.route == "buffered" and p.rates == {"direct": 6.0}
    assert p.record("buffered", 100, 0.001) is None  # ramp-up of the buffered route
    assert p.record("buffered", 10, 1.0) == "buffered"  # 10 B/s: direct not 1.2x faster
    assert p.chosen == "buffered" and p.rates["buffered"] == 10.0
    assert p.record("buffered", 1, 100.0) is None and p.chosen == "buffered"

    # direct 12 B/s; buffered 4 B/s (3x), 9.76 B/s (1.23x: past the margin), 11.1 B/s (1.08x)
    assert weights_route.DIRECT_MARGIN == 1.2
    for buffered_secs, kept in ((1.0, "direct"), (0.41, "direct"), (0.36, "buffered")):
        q = RouteProbe(4)
        q.record("direct", 1, 0.0)
        assert q.record("direct", 6, 0.5) == "buffered"
        q.record("buffered", 1, 0.0)
        assert q.record("buffered", 4, buffered_secs) == kept
    with pytest.raises(ValueError, match="probe must be positive"):
        RouteProbe(0)


def test_bytes_do_not_depend_on_the_route(tmp_path: pathlib.Path) -> None:
    """A value that straddles the switch from direct to buffered (odd sizes, offsets not
    page aligned) arrives exact: the batches before and after the switch read disjoint
    ranges."""
    rng = np.random.default_rng(3)
    state = {
        f"t{i:02d}": torch.from_numpy(rng.integers(0, 255, (3 * MIB + 77 * i,), dtype=np.uint8))
        for i in range(12)
    }
    d = tmp_path / "m"
    d.mkdir()
    safetensors_torch.save_file(state, str(d / "model.safetensors"))
    evict(d / "model.safetensors")
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(weights, "AUTO_MIN", MIB)
        mp.setattr(weights_route, "PROBE", 5 * MIB)
        it = sptorch.weights_iterator(str(d), window=12 * MIB, direct="auto")
        _same(_read_all(it), state)
        assert set(it.probe_rates) == {"direct", "buffered"}
    finally:
        mp.undo()


def test_buffered_batches_are_never_rerouted_by_load_intos_cold_judgement(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``direct=False`` reads buffered even where a batch is large enough for ``load_into``'s
    cold judgement (``direct_reads.COLD_MIN``, lowered here to one byte; a single value over
    256 MiB makes such a batch): no byte of a cold Hugging Face file comes through the
    cold-read engine (its reader counts them: ``read_kinds``), as ``direct=True`` does."""
    from shardpoint.storage import direct_reads

    state = _state(12)
    d = tmp_path / "model"
    d.mkdir()
    safetensors_torch.save_file(state, str(d / "model.safetensors"))
    monkeypatch.setattr(direct_reads, "COLD_MIN", 1)
    for direct in (False, True):
        _cold(str(d))
        it = sptorch.weights_iterator(str(d), window=8 * MIB, direct=direct)
        _same(_read_all(it), state)
        assert it.route == ("direct" if direct else "buffered")
        total = sum(it._reader.read_kinds)
        assert total == (sum(v.numel() * v.element_size() for v in state.values()) if direct else 0)
