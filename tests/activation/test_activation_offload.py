"""Disk offload compression (the "compressed when faster than the disk" decision) and the
in-place modification check of offloaded checkpoint inputs (issue 16)."""

from __future__ import annotations

import gc
import math
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from shardpoint import storage  # noqa: E402
from shardpoint.activation import CheckpointedSequential, checkpoint_sequential  # noqa: E402
from shardpoint.activation import _offload_codec as oc  # noqa: E402

INPLACE = "one of the variables needed for gradient computation has been modified by an inplace"


def mlp(dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 64))
        for _ in range(8)
    ]
    return nn.Sequential(*blocks).to(dtype)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def reference_grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    torch.manual_seed(7)
    model(x).float().sum().backward()
    return grads_of(model)


def wait_for_indexes(scratch, count: int) -> list[str]:
    """The offload writes run in the background: wait until ``count`` files are committed."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = sorted(n for n in os.listdir(scratch) if n.endswith(".index"))
        if len(names) >= count:
            return names
        time.sleep(0.01)
    raise AssertionError(f"only {os.listdir(scratch)} written")


def stored_codecs(scratch, names: list[str]) -> list[tuple[str, int, int]]:
    out = []
    for name in names:
        with storage.open(os.path.join(scratch, name[: -len(".index")])) as reader:
            info = reader.info("t")
            out.append((info.codec, info.stored_bytes, info.raw_bytes))
    return out


def run_offloaded(model, x, tmp_path, compression):
    """Forward with offload='disk' (4 segments: 3 checkpoint inputs of 128 KiB offloaded),
    the codecs of the files written, backward; returns (grads, codecs)."""
    model.zero_grad()
    torch.manual_seed(7)
    out = checkpoint_sequential(
        model, 4, x, offload="disk", offload_dir=tmp_path, offload_compression=compression
    )
    (scratch,) = os.listdir(tmp_path)
    codecs = stored_codecs(tmp_path / scratch, wait_for_indexes(tmp_path / scratch, 3))
    out.float().sum().backward()
    del out
    gc.collect()
    assert os.listdir(tmp_path) == []  # scratch removed after use, as without compression
    return grads_of(model), codecs


# --- compression ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "zstd", "bytegroup-huffman", "zstd-plain"])
def test_forced_compression_on_and_off_bitwise_grads(tmp_path, compression):
    model = mlp()
    x = torch.randn(512, 64)
    expected = reference_grads(model, x)
    grads, codecs = run_offloaded(model, x, tmp_path, compression)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
    assert len(codecs) == 3
    for codec, stored, raw in codecs:
        assert raw == 512 * 64 * 4
        if compression == "none":
            assert codec == "none" and stored == raw
        else:
            # float32 activations: the exponent bytes compress, so every file is smaller
            assert codec != "none" and stored < raw, (codec, stored, raw)


def test_forced_compression_bfloat16_bitwise_grads(tmp_path):
    """bfloat16 goes to the store as its own dtype (ml_dtypes), so the codec for bfloat16 is
    used and the bytes come back exactly."""
    model = mlp(torch.bfloat16)
    x = torch.randn(1024, 64).to(torch.bfloat16)
    expected = reference_grads(model, x)
    grads, codecs = run_offloaded(model, x, tmp_path, "zstd")
    assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
    assert all(codec != "none" and stored < raw for codec, stored, raw in codecs), codecs


def test_compression_exception_in_forward_removes_scratch(tmp_path):
    model = mlp()

    def boom(t):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        checkpoint_sequential(
            [*model, boom],
            4,
            torch.randn(512, 64),
            offload="disk",
            offload_dir=tmp_path,
            offload_compression="zstd",
        )
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_modelled_times_and_decision_from_given_figures():
    disk = oc.DiskFigures(write_bytes_per_s=1e8, read_bytes_per_s=2e8)
    codec = oc.CodecFigures("zstd", compress_bytes_per_s=1e9, decompress_bytes_per_s=4e9, ratio=0.5)
    # raw: 1e8 / 1e8 + 1e8 / 2e8 = 1.5 s; compressed: 0.1 + 0.025 + 0.5 * 1.5 = 0.875 s
    assert oc.modelled_seconds(1e8, disk) == pytest.approx(1.5)
    assert oc.modelled_seconds(1e8, disk, codec) == pytest.approx(0.875)
    assert oc.should_compress(disk, codec)
    # a fast disk: raw 1e8/5e9 + 1e8/5e9 = 0.04 s beats 0.125 + 0.5 * 0.04 = 0.145 s
    fast = oc.DiskFigures(write_bytes_per_s=5e9, read_bytes_per_s=5e9)
    assert not oc.should_compress(fast, codec)
    # incompressible data never pays
    flat = oc.CodecFigures("zstd", compress_bytes_per_s=1e12, decompress_bytes_per_s=1e12, ratio=1)
    assert not oc.should_compress(disk, flat)

    # the margin: compressed time at 95% of raw is not enough, at 85% it is
    def at(fraction: float) -> oc.CodecFigures:
        # codec work per byte w with ratio r: w + r * io = fraction * io
        io = 1 / disk.write_bytes_per_s + 1 / disk.read_bytes_per_s
        ratio = 0.5
        work = (fraction - ratio) * io
        return oc.CodecFigures("zstd", 2 / work, 2 / work, ratio)

    assert oc.modelled_seconds(1, disk, at(0.95)) == pytest.approx(
        0.95 * oc.modelled_seconds(1, disk)
    )
    assert not oc.should_compress(disk, at(0.95))
    assert oc.should_compress(disk, at(0.85))
    assert not oc.should_compress(disk, at(0.85), min_gain=0.2)


def test_auto_decides_from_the_measured_figures_once_per_process(tmp_path, monkeypatch):
    """ "auto" takes its decision from measure_disk/measure_codec (replaced here by given
    figures), measures once per process and per dtype, and writes what it decided."""
    calls = {"disk": 0, "codec": 0}
    figures = {"disk": oc.DiskFigures(5e7, 5e7)}  # a slow disk

    def fake_disk(directory, **_):
        calls["disk"] += 1
        return figures["disk"]

    def fake_codec(sample, codec, directory):
        calls["codec"] += 1
        assert sample.dtype == np.float32 and sample.nbytes <= 4 << 20
        return oc.CodecFigures(codec, 1e9, 3e9, 0.8)

    monkeypatch.setattr(oc, "measure_disk", fake_disk)
    monkeypatch.setattr(oc, "measure_codec", fake_codec)
    oc.clear_measurements()
    try:
        model = mlp()
        x = torch.randn(512, 64)
        expected = reference_grads(model, x)
        grads, codecs = run_offloaded(model, x, tmp_path / "slow", "auto")
        assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
        assert all(codec != "none" for codec, _, _ in codecs), codecs
        assert calls == {"disk": 1, "codec": 1}

        # cached: a second session measures nothing and decides the same
        _, codecs = run_offloaded(model, x, tmp_path / "slow", "auto")
        assert all(codec != "none" for codec, _, _ in codecs) and calls == {"disk": 1, "codec": 1}

        # a fast disk (measured afresh): raw
        oc.clear_measurements()
        figures["disk"] = oc.DiskFigures(5e9, 5e9)
        grads, codecs = run_offloaded(model, x, tmp_path / "fast", "auto")
        assert all(codec == "none" for codec, _, _ in codecs), codecs
        assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
        assert calls == {"disk": 2, "codec": 2}
    finally:
        oc.clear_measurements()


def test_auto_falls_back_to_raw_when_a_probe_fails(tmp_path, monkeypatch):
    def failing_disk(directory, **_):
        raise OSError(22, "fsync not supported here")

    monkeypatch.setattr(oc, "measure_disk", failing_disk)
    oc.clear_measurements()
    try:
        model = mlp()
        x = torch.randn(512, 64)
        expected = reference_grads(model, x)
        grads, codecs = run_offloaded(model, x, tmp_path, "auto")
        assert all(codec == "none" for codec, _, _ in codecs), codecs
        assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
        chooser = oc.CompressionChooser("auto")
        assert chooser.codec_for(x.numpy(), str(tmp_path)) == "none"
        assert isinstance(chooser.probe_error, OSError)
    finally:
        oc.clear_measurements()


def test_real_measurements_are_positive_and_finite(tmp_path):
    disk = oc.measure_disk(str(tmp_path), nbytes=4 << 20)
    assert 0 < disk.write_bytes_per_s < math.inf and 0 < disk.read_bytes_per_s < math.inf
    sample = oc.sample_of(torch.randn(2 << 20).numpy())  # 8 MiB: four pieces, 4 MiB
    assert sample.dtype == np.float32 and sample.nbytes == 4 << 20
    codec = oc.measure_codec(sample, "zstd", str(tmp_path))
    assert 0 < codec.compress_bytes_per_s < math.inf
    assert 0 < codec.decompress_bytes_per_s < math.inf
    assert 0.5 < codec.ratio < 0.95  # gaussian float32: the exponent plane compresses
    assert os.listdir(tmp_path) == []  # probes removed
    chooser = oc.CompressionChooser("auto")
    assert chooser.codec_for(sample, str(tmp_path)) in ("zstd", "none")


def test_offload_compression_argument_errors(tmp_path):
    model = mlp()
    x = torch.randn(64, 64)
    with pytest.raises(ValueError, match="offload_compression must be one of"):
        checkpoint_sequential(model, 4, x, offload="disk", offload_compression="lz4")
    with pytest.raises(ValueError, match="applies to offload='disk' only"):
        checkpoint_sequential(model, 4, x, offload="cpu", offload_compression="zstd")
    with pytest.raises(ValueError, match="applies to offload='disk' only"):
        CheckpointedSequential(model, 1 << 20, offload_compression="zstd")
    wrapped = CheckpointedSequential(
        model, 1 << 30, offload="disk", offload_dir=tmp_path, offload_compression="zstd"
    )
    assert wrapped.offload_compression == "zstd"
    wrapped(x).sum().backward()


# --- in-place modification of offloaded inputs --------------------------------------------------


def torch_inplace_message() -> str:
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    z = y.sin()
    y.add_(1)
    with pytest.raises(RuntimeError) as info:
        z.sum().backward()
    return str(info.value)


def test_inplace_message_starts_as_torchs():
    ours_start = INPLACE + " operation: ["
    assert torch_inplace_message().startswith(ours_start)


@pytest.mark.parametrize("offload", ["disk", "cpu"])
def test_inplace_modified_offloaded_input_raises(tmp_path, offload):
    model = mlp()
    x = torch.randn(512, 64, requires_grad=True)
    h = model[0](x)  # the checkpoints' first input, produced outside them
    out = checkpoint_sequential(list(model)[1:], 4, h, offload=offload, offload_dir=tmp_path)
    h.mul_(2)
    with pytest.raises(RuntimeError, match=INPLACE) as info:
        out.sum().backward()
    assert "is at version 1; expected version 0 instead" in str(info.value)
    assert f"offload={offload!r}" in str(info.value) or f"offloaded to {offload}" in str(info.value)
    del out, info
    gc.collect()
    assert os.listdir(tmp_path) == []


def test_inplace_through_a_view_after_the_input_died(tmp_path):
    """The check does not need the tensor itself: a view (which shares its version counter)
    modified after the checkpoint input was dropped is caught too."""
    model = mlp()
    h = model[0](torch.randn(512, 64))
    view = h[:16]
    out = checkpoint_sequential(list(model)[1:], 4, h, offload="disk", offload_dir=tmp_path)
    del h
    view.zero_()
    with pytest.raises(RuntimeError, match=INPLACE):
        out.sum().backward()


def test_modifying_a_clone_or_after_backward_does_not_raise(tmp_path):
    model = mlp()
    x = torch.randn(512, 64)
    expected = reference_grads(model, x)
    model.zero_grad()
    torch.manual_seed(7)
    h = x.clone()
    out = checkpoint_sequential(model, 4, h, offload="disk", offload_dir=tmp_path)
    h.clone().mul_(3)  # a clone has its own version counter
    out.sum().backward()
    h.mul_(2)  # after backward nothing needs it any more
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))


# --- the single-checkpoint function (issue 22) -----------------------------------------------


@pytest.mark.parametrize("offload", ["disk", "cpu"])
def test_single_checkpoint_offload_bitwise_grads(tmp_path, offload):
    """checkpoint(fn, *args, offload=...) as checkpoint_sequential: the input it keeps goes
    to disk (one file, read back in backward) and gradients are bitwise those without
    checkpointing, keyword arguments and dropout included."""
    from shardpoint.activation import checkpoint

    model = mlp()[:3]
    x = torch.randn(512, 64)
    scale = torch.tensor(0.5)

    def body(h, *, factor):
        return model[1:](h) * factor

    model.zero_grad()
    torch.manual_seed(7)
    body(model[0](x), factor=scale).sum().backward()
    expected = grads_of(model)

    model.zero_grad()
    torch.manual_seed(7)
    out = checkpoint(
        body,
        model[0](x),
        factor=scale,
        offload=offload,
        offload_dir=tmp_path,
        offload_compression="none" if offload == "disk" else "auto",
    )
    if offload == "disk":
        (scratch,) = os.listdir(tmp_path)
        names = wait_for_indexes(tmp_path / scratch, 1)  # the 128 KiB input of `body`
        assert stored_codecs(tmp_path / scratch, names) == [("none", 512 * 64 * 4, 512 * 64 * 4)]
    out.sum().backward()
    del out
    gc.collect()
    assert os.listdir(tmp_path) == []
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))


def test_single_checkpoint_offload_argument_errors(tmp_path):
    from shardpoint.activation import checkpoint

    x = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="offload must be one of"):
        checkpoint(torch.sin, x, offload="gpu")
    with pytest.raises(ValueError, match="only supported with use_reentrant=False"):
        checkpoint(torch.sin, x, offload="cpu", use_reentrant=True)
    with pytest.raises(ValueError, match="applies to offload='disk' only"):
        checkpoint(torch.sin, x, offload="cpu", offload_compression="zstd")
    with torch.no_grad():  # nothing kept for backward: no scratch directory at all
        assert torch.equal(checkpoint(torch.sin, x, offload="disk", offload_dir=tmp_path), x.sin())
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)"
)
@pytest.mark.parametrize("offload", ["disk", "cpu"])
def test_single_checkpoint_offload_cuda_bitwise_grads(tmp_path, offload):  # pragma: no cover
    """The device paths: a CUDA input goes to pinned host memory (or through it to disk) and
    comes back for the recompute; dropout replays the CUDA RNG."""
    from shardpoint.activation import checkpoint

    model = mlp()[:3].cuda()
    x = torch.randn(1024, 64, device="cuda")

    def body(h):
        return model[1:](h)

    model.zero_grad()
    torch.manual_seed(7)
    body(model[0](x)).sum().backward()
    expected = grads_of(model)
    model.zero_grad()
    torch.manual_seed(7)
    out = checkpoint(body, model[0](x), offload=offload, offload_dir=tmp_path)
    out.sum().backward()
    del out
    gc.collect()
    assert os.listdir(tmp_path) == []
    assert all(torch.equal(a, b) for a, b in zip(grads_of(model), expected, strict=True))
