"""``weights_iterator`` over an object store: batches are read several at a time (one decoded
while the next ones download, shardpoint/torch/weights.py ``_REMOTE_DEPTH``); values still come
out in file order, equal to what was saved, within the window, and a failed GET in a later
batch is raised to the consumer (not a hang, not a short iteration)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import shardpoint.torch as sptorch  # noqa: E402 - after the importorskip
import shardpoint.torch.weights as weights  # noqa: E402
from s3_server import Proxy, opts_for  # noqa: E402


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # 48 values of 64 KiB: with 128 KiB batches, 24 batches read overlapping
    return {f"w.{i:03d}": torch.randn(128, 128, generator=g).to(torch.float32) for i in range(48)}


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_overlapped_batches_keep_order_values_and_window(
    bucket: str, monkeypatch: pytest.MonkeyPatch, compression: str
) -> None:
    state = _state()
    url = f"s3://{bucket}/w-{compression}"
    sptorch.save(state, url, compression=compression)
    monkeypatch.setattr(weights, "_REMOTE_BATCH", 128 << 10)
    window = 512 << 10
    it = sptorch.weights_iterator(url, window=window)
    names, peak = [], 0
    for name, t in it:
        peak = max(peak, it._inflight)
        names.append(name)
        assert torch.equal(t, state[name]), name
    assert names == sorted(state)  # saved in key order: file order
    assert 0 < peak <= window


def test_a_failed_get_in_a_later_batch_is_raised(
    bucket: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state()
    url = f"s3://{bucket}/w-fail"
    sptorch.save(state, url, compression="none")
    monkeypatch.setattr(weights, "_REMOTE_BATCH", 128 << 10)
    # a window of two batches: the reads wait for the consumer, so the fault lands mid-way
    it = sptorch.weights_iterator(url, storage_options=opts_for(proxy), window=256 << 10)
    proxy.fail_after(6, "403")  # a few batches' GETs pass, then one is refused for good
    got = []
    with pytest.raises(OSError, match="403|Forbidden|AccessDenied"):
        for name, t in it:
            got.append(name)
            assert torch.equal(t, state[name])
    assert len(got) < len(state)
    assert not it._thread.is_alive()
