"""torch habits (issue 22): ``sptorch.save(sd, "model.pt")`` leaves one file that
``sptorch.load("model.pt")`` reads; ``load`` takes ``torch.load``'s arguments with their meaning
(``map_location`` as str, device, dict or callable; ``weights_only``; ``mmap``;
``pickle_module``); file objects (``io.BytesIO``, files opened ``"wb"``/``"rb"``) work for save
and load as with ``torch.save``/``torch.load``."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
import shardpoint.torch as sptorch  # noqa: E402
from shardpoint.errors import InvalidArgumentError  # noqa: E402


def _sd() -> dict[str, object]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    w = lin.weight.detach()
    return {
        "model": {"weight": w, "bias": lin.bias.detach(), "tied": w},
        "big": torch.arange(1 << 16, dtype=torch.float32),
        "half": torch.randn(100, dtype=torch.bfloat16),
        "step": 3,
        "sizes": [1, 2],
    }


def _assert_same(got: dict, want: dict) -> None:
    assert torch.equal(got["model"]["weight"], want["model"]["weight"])
    assert torch.equal(got["model"]["bias"], want["model"]["bias"])
    assert got["model"]["tied"] is got["model"]["weight"]
    assert torch.equal(got["big"], want["big"])
    assert torch.equal(got["half"], want["half"]) and got["half"].dtype == torch.bfloat16
    assert got["step"] == 3 and got["sizes"] == [1, 2]


@pytest.mark.parametrize("name", ["model.pt", "model.pth", "pytorch_model.bin"])
def test_save_to_a_file_name_leaves_that_one_file(tmp_path, name):
    sd = _sd()
    sptorch.save(sd, tmp_path / name)
    assert os.listdir(tmp_path) == [name]
    _assert_same(sptorch.load(tmp_path / name), sd)
    _assert_same(sptorch.load(str(tmp_path / name), map_location="cpu", weights_only=True), sd)
    # the storage face reads it too (flat keys)
    assert "model/weight" in sp.load_file(tmp_path / name)


def test_weights_only_and_pickle_module_accepted_with_the_same_result(tmp_path):
    sd = _sd()
    sptorch.save(sd, tmp_path / "m.pt")
    for wo in (True, False, None):
        _assert_same(sptorch.load(tmp_path / "m.pt", weights_only=wo), sd)
    _assert_same(sptorch.load(tmp_path / "m.pt", None, pickle, encoding="latin1"), sd)
    with pytest.raises(InvalidArgumentError, match="unpickle"):
        sptorch.load(tmp_path / "m.pt", pickle_module=object())


def test_mmap_true_is_zero_copy_and_false_is_private_memory(tmp_path):
    sd = {"big": torch.arange(1 << 16, dtype=torch.float32)}
    sptorch.save(sd, tmp_path / "m.pt", compression="none")
    mapped = sptorch.load(tmp_path / "m.pt", mmap=True)["big"]
    private = sptorch.load(tmp_path / "m.pt", mmap=False)["big"]
    assert torch.equal(mapped, sd["big"]) and torch.equal(private, sd["big"])
    size = os.path.getsize(tmp_path / "m.pt")
    maps = open("/proc/self/maps").read()
    assert str(tmp_path / "m.pt") in maps  # the mmap=True view maps the file
    del mapped
    # mmap=False keeps nothing mapped: writes go to private memory, the file is untouched
    private += 1
    assert os.path.getsize(tmp_path / "m.pt") == size
    assert torch.equal(sptorch.load(tmp_path / "m.pt")["big"], sd["big"])


def test_map_location_forms_on_cpu(tmp_path):
    sd = _sd()
    sptorch.save(sd, tmp_path / "m.pt")
    for ml in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, {"cuda:0": "cpu"}):
        got = sptorch.load(tmp_path / "m.pt", map_location=ml)
        _assert_same(got, sd)
        assert got["big"].device.type == "cpu"
    seen: list[tuple[str, int]] = []

    def fn(storage, location):
        assert isinstance(storage, torch.UntypedStorage) and storage.device.type == "cpu"
        seen.append((location, storage.nbytes()))
        return None  # default placement

    _assert_same(sptorch.load(tmp_path / "m.pt", map_location=fn), sd)
    # once per storage: the tied weight is one storage, so 4 storages for 5 tensors
    assert len(seen) == 4 and {loc for loc, _ in seen} == {"cpu"}

    def to_fresh(storage, location):
        return storage.clone()  # a storage returned is used as is

    got = sptorch.load(tmp_path / "m.pt", map_location=to_fresh)
    _assert_same(got, sd)
    with pytest.raises(InvalidArgumentError, match="expected a storage"):
        sptorch.load(tmp_path / "m.pt", map_location=lambda s, loc: 5)
    # the older keyword still works
    _assert_same(sptorch.load(tmp_path / "m.pt", device="cpu"), sd)


def test_saved_device_recorded_and_unavailable_device_named(tmp_path):
    """The location tag of a non-CPU tensor is recorded; map_location=None restores it, as
    torch.load does, and a machine without that device gets an error naming the key and the
    remedy. (CPU-only here: a 'meta'-free fake location is written by hand.)"""
    sd = {"w": torch.ones(3)}
    sptorch.save(sd, tmp_path / "m.pt")
    with sp.open(tmp_path / "m.pt") as r:
        meta = r.sections["shardpoint.torch"]
    assert "devices" not in meta  # CPU tensors record nothing
    from shardpoint.torch.locations import place

    out = {"w": torch.ones(3)}
    if not torch.cuda.is_available():
        with pytest.raises(InvalidArgumentError, match=r"'w'.*cuda:0.*map_location='cpu'") as e:
            place(out, {"w": "cuda:0"}, None)
        # torch.load's class and words for the same mistake
        assert isinstance(e.value, RuntimeError)
        assert str(e.value).startswith("Attempting to deserialize object on a CUDA device")
    place(out, {"w": "cuda:0"}, {"cuda:0": "cpu"})
    assert out["w"].device.type == "cpu"


def test_file_objects_bytesio_and_real_files(tmp_path):
    sd = _sd()
    buf = io.BytesIO()
    sptorch.save(sd, buf)
    assert buf.tell() == len(buf.getvalue()) > 0
    buf.seek(0)
    _assert_same(sptorch.load(buf), sd)
    assert buf.tell() == len(buf.getvalue())
    # a file opened "wb" / "rb"
    with open(tmp_path / "f.bin", "wb") as f:
        sptorch.save(sd, f)
    with open(tmp_path / "f.bin", "rb") as f:
        _assert_same(sptorch.load(f, map_location="cpu"), sd)
    # the bytes are a single-file checkpoint: readable by path too
    _assert_same(sptorch.load(tmp_path / "f.bin"), sd)
    # a stream with something before the checkpoint (read from its current position)
    with open(tmp_path / "pre.bin", "wb") as f:
        f.write(b"HEADER")
        sptorch.save(sd, f)
    with open(tmp_path / "pre.bin", "rb") as f:
        assert f.read(6) == b"HEADER"
        _assert_same(sptorch.load(f), sd)
    with pytest.raises(InvalidArgumentError, match="blocking"):
        sptorch.save(sd, io.BytesIO(), blocking=False)
    from shardpoint.errors import CorruptCheckpointError

    with pytest.raises(CorruptCheckpointError, match="empty"):
        sptorch.load(io.BytesIO())
    with pytest.raises(CorruptCheckpointError):
        sptorch.load(io.BytesIO(b"not a checkpoint at all" * 400))


def test_decompressing_streams_are_read_as_their_bytes(tmp_path):
    """``torch.load(gzip.open(p))`` of a compressed copy of a checkpoint (an archive, an
    upload): the wrapper's ``fileno()`` is the compressed file's, and reading that file gave
    "does not start with the single-file magic". The stream's own bytes are read; a plain
    file still goes in place (its own descriptor), and so does an fsspec local file."""
    import bz2
    import gzip
    import lzma
    import subprocess
    import sys

    sd = _sd()
    plain = tmp_path / "c.ckpt"
    sptorch.save(sd, plain, single_file=True)
    for opener, suffix in ((gzip.open, ".gz"), (bz2.open, ".bz2"), (lzma.open, ".xz")):
        packed = tmp_path / f"c.ckpt{suffix}"
        with open(plain, "rb") as src, opener(packed, "wb") as dst:
            dst.write(src.read())
        with opener(packed, "rb") as f:
            _assert_same(sptorch.load(f), sd)
    code = (
        "import gzip, sys, torch\n"
        "with gzip.open(sys.argv[1], 'rb') as f:\n"
        "    print(sorted(torch.load(f, map_location='cpu')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c.ckpt.gz")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(sorted(sd))
    fsspec = pytest.importorskip("fsspec")
    with fsspec.filesystem("file").open(str(plain), "rb") as f:
        _assert_same(sptorch.load(f), sd)


def test_stream_errors_name_the_stream_not_a_private_path(tmp_path):
    """A damaged checkpoint read from a file object: the error names the file (its ``name``)
    or the stream's type, never the /proc/self/fd/N or temp path the core opened."""
    buf = io.BytesIO()
    sptorch.save({"a": torch.arange(3000.0)}, buf)
    data = bytearray(buf.getvalue())
    data[-5000] ^= 0xFF  # inside the payload of "a" (the index and trailer are the last 4 KiB)
    (tmp_path / "bad.sp").write_bytes(bytes(data))
    with pytest.raises(sp.ChecksumMismatchError, match=r"^<_io\.BytesIO stream>: .*key \"a\""):
        sptorch.load(io.BytesIO(bytes(data)))
    for load in (sptorch.load, torch.load):
        with open(tmp_path / "bad.sp", "rb") as f, pytest.raises(sp.ChecksumMismatchError) as ei:
            load(f)
        assert str(ei.value).startswith(str(tmp_path / "bad.sp") + ":"), ei.value
        assert "/proc/self/fd" not in str(ei.value)
    with pytest.raises(sp.CorruptCheckpointError, match=r"^<_io\.BytesIO stream>: .*shorter"):
        sptorch.load(io.BytesIO(bytes(data[:3000])))


def test_numpy_values_and_load_into_model(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    sptorch.save(model.state_dict(), tmp_path / "model.pt")
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    fresh.load_state_dict(sptorch.load(tmp_path / "model.pt", map_location="cpu"))
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    arr = {"a": np.arange(5)}
    sptorch.save(arr, tmp_path / "np.pt")
    assert isinstance(sptorch.load(tmp_path / "np.pt")["a"], np.ndarray)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_map_location_on_a_gpu(tmp_path):
    """The location tags, map_location=None/str/dict/callable and shared storage on a real
    GPU (runs where CUDA is present)."""
    w = torch.randn(16, 8, device="cuda:0")
    sd = {"w": w, "tied": w, "view": w[1], "cpu": torch.arange(5), "step": 2}
    sptorch.save(sd, tmp_path / "g.pt")
    with sp.open(tmp_path / "g.pt") as r:
        assert r.sections["shardpoint.torch"]["devices"]["w"] == "cuda:0"
    got = sptorch.load(tmp_path / "g.pt")  # None: back where each was saved from
    assert got["w"].device == torch.device("cuda:0") and got["cpu"].device.type == "cpu"
    assert got["tied"] is got["w"] and got["view"].untyped_storage().data_ptr() == (
        got["w"].untyped_storage().data_ptr()
    )
    assert torch.equal(got["w"], w) and torch.equal(got["view"], w[1])
    on_gpu = sptorch.load(tmp_path / "g.pt", map_location="cuda")
    assert {v.device.type for v in on_gpu.values() if isinstance(v, torch.Tensor)} == {"cuda"}
    to_cpu = sptorch.load(tmp_path / "g.pt", map_location={"cuda:0": "cpu"})
    assert {v.device.type for v in to_cpu.values() if isinstance(v, torch.Tensor)} == {"cpu"}
    assert torch.equal(to_cpu["w"], w.cpu())
    up = sptorch.load(tmp_path / "g.pt", map_location={"cpu": "cuda:0"})
    assert up["cpu"].device.type == "cuda" and up["w"].device.type == "cuda"
    calls: list[str] = []

    def fn(storage, location):
        calls.append(location)
        return storage.cuda() if location == "cpu" else None

    cb = sptorch.load(tmp_path / "g.pt", map_location=fn)
    assert sorted(calls) == ["cpu", "cuda:0"]  # one call per storage (w, tied, view share one)
    assert cb["cpu"].device.type == "cuda" and torch.equal(cb["cpu"].cpu(), torch.arange(5))
    assert cb["w"].device == torch.device("cuda:0")
    fut = sptorch.save(sd, tmp_path / "async.pt", blocking=False)
    assert fut is not None
    fut.result()
    assert torch.equal(sptorch.load(tmp_path / "async.pt", map_location="cpu")["w"], w.cpu())


_MAP_TO_GPU = """
import sys, warnings
import torch
warnings.simplefilter("ignore")
for path in sys.argv[1:]:
    for ml in ("cuda", "cuda:0", {"cpu": "cuda:0"}, torch.device("cuda", 0)):
        try:
            got = torch.load(path, map_location=ml)
            print("loaded", got["w"].device.type)
        except RuntimeError as e:
            print(type(e).__name__ if type(e) is RuntimeError else "subclass", str(e)[:60])
"""


def test_torch_load_to_a_missing_gpu_fails_as_torch_does(tmp_path):
    """The next script on a CPU-only machine asks for the GPU the checkpoint was trained on:
    ``torch.load`` of our file fails as it does for its own file (a ``RuntimeError``, the same
    words), in a fresh process where the startup file fronts torch.load."""
    import subprocess
    import sys

    sd = {"w": torch.arange(4.0), "n": 3}
    torch.save(sd, tmp_path / "theirs.pt")
    sptorch.save(sd, tmp_path / "ours.pt")
    out = subprocess.run(
        [sys.executable, "-c", _MAP_TO_GPU, str(tmp_path / "theirs.pt"), str(tmp_path / "ours.pt")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(out) == 8
    theirs, ours = out[:4], out[4:]
    # the class differs only by being ours (a RuntimeError subclass); the words are torch's
    assert [line.replace("subclass", "RuntimeError") for line in ours] == theirs
    if not torch.cuda.is_available():
        assert all(line.startswith("subclass Attempting to deserialize") for line in ours)
