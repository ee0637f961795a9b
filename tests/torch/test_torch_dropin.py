"""shardpoint.torch as a drop-in for safetensors.torch: save_model/load_model with tied weights,
missing/unexpected keys as safetensors' load_model reports them (load_into: as torch's
load_state_dict), the dtypes torch has, exact user metadata, and exception classes that also
catch as what safetensors raises for the same mistakes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402
from shardpoint.errors import (  # noqa: E402
    MetaTensorError,
    SparseTensorError,
    UnknownDTypeError,
    UnsupportedDTypeError,
)

st_torch = pytest.importorskip("safetensors.torch")


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def _fresh(seed: int) -> Tied:
    torch.manual_seed(seed)
    return Tied()


def test_save_model_load_model_tied_weights(tmp_path):
    src = _fresh(0)
    spt.save_model(src, tmp_path / "m", metadata={"format": "pt"})
    dst = _fresh(1)
    result = spt.load_model(dst, tmp_path / "m")
    assert result == ([], []) and result.missing_keys == [] and result.unexpected_keys == []
    for name, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[name], value), name
    assert dst.head.weight is dst.embed.weight  # still tied: values copied in place
    with sp.open(tmp_path / "m") as r:
        assert r.metadata == {"format": "pt"}
        # the tied weight is stored once, like safetensors' save_model
        assert sum(k.endswith("weight") and "body" not in k for k in r.keys()) == 1


def test_load_model_resolves_tied_names_missing_from_the_checkpoint(tmp_path):
    """A checkpoint that kept one name of a tied group (safetensors' save_model drops the
    others) loads completely, whichever name was kept."""
    src = _fresh(0)
    for kept, dropped in (("embed.weight", "head.weight"), ("head.weight", "embed.weight")):
        sd = {k: v for k, v in src.state_dict().items() if k != dropped}
        spt.save(sd, tmp_path / kept)
        dst = _fresh(1)
        assert spt.load_model(dst, tmp_path / kept) == ([], [])
        assert torch.equal(dst.embed.weight, src.embed.weight)
        assert dst.head.weight is dst.embed.weight


def test_load_model_reads_safetensors_save_model_output(tmp_path):
    src = _fresh(0)
    st_torch.save_model(src, str(tmp_path / "m.safetensors"))
    from shardpoint.convert import convert

    convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m"))
    dst = _fresh(1)
    assert spt.load_model(dst, tmp_path / "m") == ([], [])
    assert torch.equal(dst.head.weight, src.head.weight)


def _hooked(model: torch.nn.Module) -> torch.nn.Module:
    """The model with a (no-op) load_state_dict pre-hook: load_model takes its general path
    (load + load_state_dict) instead of decoding into the parameters."""
    model.register_load_state_dict_pre_hook(lambda *args, **kwargs: None)
    return model


@pytest.mark.parametrize("path", ["direct", "general"])
def test_load_model_missing_and_unexpected_keys_as_safetensors(tmp_path, path):
    """Several missing and unexpected names, neither list in name order: the strict error is
    safetensors.torch.load_model's for the same file, character for character (names sorted,
    its indentation), on both of load_model's paths."""
    src = _fresh(0)
    sd = dict(src.state_dict())
    # head.weight is embed.weight (tied): safetensors' save_file refuses to store both
    del sd["body.bias"], sd["body.weight"], sd["head.weight"]
    sd["zz.extra"] = torch.zeros(2)
    sd["aa.extra"] = torch.ones(2)
    spt.save(sd, tmp_path / "m")
    st_torch.save_file(sd, str(tmp_path / "m.safetensors"))
    make = _fresh if path == "direct" else (lambda seed: _hooked(_fresh(seed)))
    with pytest.raises(RuntimeError) as ours:
        spt.load_model(make(1), tmp_path / "m")
    with pytest.raises(RuntimeError) as theirs:
        st_torch.load_model(make(1), str(tmp_path / "m.safetensors"))
    assert str(ours.value) == str(theirs.value)
    assert 'Unexpected key(s) in state_dict: "aa.extra", "zz.extra"' in str(ours.value)


def test_load_into_keeps_torchs_wording(tmp_path):
    """load_into (shardpoint's own call, documented as load_state_dict's twin) words the same
    mistake as torch's load_state_dict does."""
    sd = dict(_fresh(0).state_dict())
    del sd["body.bias"]
    sd["extra.weight"] = torch.zeros(2)
    spt.save(sd, tmp_path / "m")
    with pytest.raises(RuntimeError) as ours:
        spt.load_into(_fresh(1), tmp_path / "m")
    with pytest.raises(RuntimeError) as theirs:
        _fresh(1).load_state_dict(sd, strict=True)
    assert str(ours.value) == str(theirs.value)


def test_load_model_missing_and_unexpected_keys_returned(tmp_path):
    src = _fresh(0)
    sd = dict(src.state_dict())
    del sd["body.bias"]
    sd["extra.weight"] = torch.zeros(2)
    spt.save(sd, tmp_path / "m")
    dst = _fresh(1)
    missing, unexpected = spt.load_model(dst, tmp_path / "m", strict=False)
    assert missing == ["body.bias"] and unexpected == ["extra.weight"]
    assert torch.equal(dst.body.weight, src.body.weight)  # the rest was loaded


def test_load_model_shape_mismatch_raises_like_torch(tmp_path):
    sd = dict(_fresh(0).state_dict())
    sd["body.weight"] = torch.zeros(3, 3)
    spt.save(sd, tmp_path / "m")
    with pytest.raises(RuntimeError, match="size mismatch for body.weight"):
        spt.load_model(_fresh(1), tmp_path / "m", strict=False)


NEW_DTYPES = [
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
]


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("dtype", NEW_DTYPES, ids=str)
def test_dtypes_safetensors_has_round_trip(tmp_path, dtype, compression):
    raw = torch.randint(0, 256, (6000,), dtype=torch.uint8)
    t = raw.view(dtype).reshape(60, 100)
    spt.save({"t": t, "view": t[:, ::2]}, tmp_path / "ck", compression=compression)
    back = spt.load(tmp_path / "ck")
    assert back["t"].dtype == dtype and back["t"].shape == t.shape
    assert torch.equal(back["t"].view(torch.uint8), t.view(torch.uint8))
    assert torch.equal(
        back["view"].contiguous().view(torch.uint8), t[:, ::2].contiguous().view(torch.uint8)
    )
    with sp.open(tmp_path / "ck") as r:
        assert r.info("t").dtype == str(dtype).removeprefix("torch.")
        arr = r["t"]  # numpy side: ml_dtypes type, or uint8 tagged as packed fp4
        assert arr.dtype.itemsize == 1 and arr.shape == (60, 100)
    # the numpy value saves back under the same dtype
    sp.save_file({"t": arr}, tmp_path / "again", durable=False)
    with sp.open(tmp_path / "again") as r:
        assert r.info("t").dtype == str(dtype).removeprefix("torch.")


def test_metadata_reads_back_exactly(tmp_path):
    m = {"shardpoint.torch": "mine", "user": {"a": [1, 2]}, "format": "pt"}
    nested = {"model": {"w": torch.ones(2)}, "step": 3}
    spt.save(nested, tmp_path / "ck", metadata=m)
    with sp.open(tmp_path / "ck") as r:
        assert r.metadata == m  # nothing of ours inside, even under our section's name
        assert "shardpoint.torch" in r.sections
    back = spt.load(tmp_path / "ck")
    assert back["step"] == 3 and torch.equal(back["model"]["w"], torch.ones(2))
    spt.save(nested, tmp_path / "none")
    with sp.open(tmp_path / "none") as r:
        assert r.metadata == {}


def test_loads_checkpoints_that_kept_the_section_in_user_metadata(tmp_path):
    """Checkpoints written before metadata sections kept the nesting in the user dict."""
    from shardpoint.torch.tensors import METADATA_KEY, _prepare

    payload, meta = _prepare({"a": {"b": torch.arange(3)}})
    sp.save_file(payload, tmp_path / "old", metadata={METADATA_KEY: meta}, durable=False)
    back = spt.load(tmp_path / "old")
    assert torch.equal(back["a"]["b"], torch.arange(3))


def _peer_error(value):
    try:
        st_torch.save_file({"a": value}, "/dev/null")
    except Exception as e:  # noqa: BLE001 - we want whatever safetensors raises
        return type(e)
    raise AssertionError("safetensors accepted it")


@pytest.mark.parametrize(
    "make,ours",
    [
        (lambda: torch.empty(2, device="meta"), MetaTensorError),
        (lambda: torch.eye(2).to_sparse(), SparseTensorError),
        (lambda: torch.zeros(2, dtype=torch.complex32), UnknownDTypeError),
        (
            lambda: torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.qint8),
            UnknownDTypeError,
        ),
    ],
    ids=["meta", "sparse", "complex32", "qint8"],
)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_exception_classes_catch_as_safetensors(tmp_path, make, ours):
    value = make()
    peer = _peer_error(value)
    with pytest.raises(ours) as info:
        spt.save({"a": value}, tmp_path / "ck")
    assert isinstance(info.value, peer)  # `except` written for safetensors still catches
    assert isinstance(info.value, UnsupportedDTypeError) and isinstance(info.value, TypeError)
    assert str(info.value) and not str(info.value).startswith("'")  # readable, not a repr


def _open_in(directory) -> tuple[int, int]:
    """(file descriptors, mappings) of this process on files under ``directory``."""
    import gc
    import os

    gc.collect()
    d = os.fspath(directory)
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{fd}").startswith(d)
        except OSError:
            pass
    with open("/proc/self/maps") as fh:
        maps = sum(d in line for line in fh)
    return fds, maps


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_loads_close_their_files(tmp_path):
    import torch.distributed.checkpoint as dcp

    src = _fresh(0)
    spt.save_model(src, tmp_path / "m", compression="zstd")
    spt.load_model(_fresh(1), tmp_path / "m")
    assert _open_in(tmp_path) == (0, 0)
    sd = spt.load(tmp_path / "m")
    assert _open_in(tmp_path)[0] == 0  # small tensors are views of a mapping, no descriptor
    del sd
    assert _open_in(tmp_path) == (0, 0)
    state = {"w": torch.arange(12.0).reshape(3, 4)}
    dcp.save(state, storage_writer=spt.StorageWriter(tmp_path / "dcp"))
    # the save's merge cleans up in the background, holding the prefix's lock file open
    sp.wait_for_cleanups()
    reader = spt.StorageReader(tmp_path / "dcp")
    target = {"w": torch.zeros(3, 4)}
    dcp.load(target, storage_reader=reader)
    assert torch.equal(target["w"], state["w"])
    assert _open_in(tmp_path) == (0, 0)  # closed after read_data, the reader object alive
    dcp.load(target, storage_reader=reader)  # and reopened on demand
    assert _open_in(tmp_path) == (0, 0) and reader is not None


def test_new_float8_types_convert_to_and_from_safetensors(tmp_path):
    """safetensors files holding fnuz / e8m0 tensors convert both ways (F4's shape counts 4-bit
    values there and bytes here, so packed fp4 stays ours)."""
    from shardpoint.convert import convert

    raw = torch.randint(0, 256, (64,), dtype=torch.uint8)
    sd = {
        str(dt).removeprefix("torch."): raw.clone().view(dt).reshape(8, 8)
        for dt in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu)
    }
    st_torch.save_file(sd, str(tmp_path / "in.safetensors"))
    convert(str(tmp_path / "in.safetensors"), str(tmp_path / "ck"))
    back = spt.load(tmp_path / "ck")
    for name, t in sd.items():
        assert back[name].dtype == t.dtype and torch.equal(
            back[name].view(torch.uint8), raw.view(8, 8)
        )
    convert(str(tmp_path / "ck"), str(tmp_path / "out.safetensors"))
    again = st_torch.load_file(str(tmp_path / "out.safetensors"))
    for name, t in sd.items():
        assert again[name].dtype == t.dtype and torch.equal(
            again[name].view(torch.uint8), raw.view(8, 8)
        )
