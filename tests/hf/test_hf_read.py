"""``sp.open`` on Hugging Face directories written by the real ``huggingface_hub``.

The directories are made by ``huggingface_hub.save_torch_state_dict`` (sharded and single-file,
with a tied weight, bf16, fp8), and every tensor read through ``sp.open`` is compared bit for bit
with what ``safetensors.safe_open`` returns for the same file.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch builds the state dicts the hub saves")
hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is the writer under test")
from safetensors import safe_open  # noqa: E402

import shardpoint as sp  # noqa: E402
from shardpoint.errors import InvalidSliceError  # noqa: E402


def _state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(64, 32, generator=g)
    sd = {
        "embed.weight": emb,
        "lm_head.weight": emb,  # tied: the same storage under two names
        "layers.0.attn.q.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16),
        "layers.0.attn.k.weight": torch.randn(32, 32, generator=g).to(torch.float16),
        "layers.0.mlp.w8a": torch.randn(48, 16, generator=g).to(torch.float8_e4m3fn),
        "layers.0.mlp.w8b": torch.randn(16, 48, generator=g).to(torch.float8_e5m2),
        "layers.1.norm.weight": torch.randn(32, generator=g, dtype=torch.float64),
        "layers.1.ids": torch.arange(100, dtype=torch.int64),
        "layers.1.mask": torch.rand(10, 3, generator=g) > 0.5,
        "layers.1.scalar": torch.tensor(3.5),
        "layers.1.empty": torch.zeros(0, 4),
    }
    return sd


def _bytes_of(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("hf_sharded")
    hub.save_torch_state_dict(_state_dict(), d, max_shard_size="3KB")
    return str(d)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("hf_single")
    hub.save_torch_state_dict(_state_dict(), d)
    return str(d)


def _safe_open_all(directory: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="pt") as f:
                for k in f.keys():
                    out[k] = _bytes_of(f.get_tensor(k))
    return out


def test_sharded_dir_reads_bit_for_bit(sharded: str) -> None:
    shard_files = [n for n in os.listdir(sharded) if n.endswith(".safetensors")]
    assert len(shard_files) > 3, "the fixture must really be sharded"
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    want = _safe_open_all(sharded)
    with sp.open(sharded) as r:
        assert isinstance(r, sp.Reader)
        assert r.keys() == sorted(weight_map)
        assert len(r) == len(weight_map)
        for k in r.keys():
            a = r[k]
            assert a.reshape(-1).view(np.uint8).tobytes() == want[k], k
        sd = _state_dict()
        assert r["layers.0.attn.q.weight"].dtype.name == "bfloat16"
        assert r["layers.0.mlp.w8a"].dtype.name == "float8_e4m3fn"
        assert r["layers.0.mlp.w8b"].dtype.name == "float8_e5m2"
        assert r["layers.1.scalar"].shape == ()
        assert r["layers.1.empty"].shape == (0, 4)
        assert np.array_equal(r["layers.1.ids"], sd["layers.1.ids"].numpy())
        assert np.array_equal(r["layers.1.mask"], sd["layers.1.mask"].numpy())


def test_tied_weight_kept_once_with_its_alias_in_metadata(sharded: str) -> None:
    with sp.open(sharded) as r:
        # The hub keeps the alphabetically first name and records the dropped one.
        assert "embed.weight" in r and "lm_head.weight" not in r
        assert r.metadata["lm_head.weight"] == "embed.weight"
        assert r.metadata["total_size"] > 0
        assert np.array_equal(r["embed.weight"], _state_dict()["embed.weight"].numpy())


def test_single_file_by_dir_and_by_file(single: str) -> None:
    assert os.listdir(single) == ["model.safetensors"]
    want = _safe_open_all(single)
    for path in (single, os.path.join(single, "model.safetensors")):
        with sp.open(path) as r:
            assert r.keys() == sorted(want)
            for k in r.keys():
                assert r[k].reshape(-1).view(np.uint8).tobytes() == want[k]
            assert r.metadata["format"] == "pt"
            assert r.metadata["lm_head.weight"] == "embed.weight"


def test_open_by_index_json_path(sharded: str) -> None:
    with sp.open(os.path.join(sharded, "model.safetensors.index.json")) as r:
        assert "layers.1.ids" in r
        assert r.index_path.endswith("model.safetensors.index.json")
        assert np.array_equal(r["layers.1.ids"], np.arange(100))


def test_info_slice_get_slice_across_shards(sharded: str) -> None:
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    with sp.open(sharded) as r:
        files_seen = set()
        for k in ["embed.weight", "layers.0.attn.q.weight", "layers.1.norm.weight", "layers.1.ids"]:
            full = np.array(r[k])
            i = r.info(k)
            assert i.shape == full.shape and i.raw_bytes == full.nbytes and i.codec == "none"
            files_seen.add(weight_map[k])
            assert np.array_equal(r.slice(k, 1, 5), full[1:5])
            s = r.get_slice(k)
            assert s.get_shape() == list(full.shape)
            with safe_open(os.path.join(sharded, weight_map[k]), framework="pt") as f:
                assert s.get_dtype() == f.get_slice(k).get_dtype()
            for idx in [np.s_[2:7], np.s_[::3], np.s_[-3:], np.s_[..., 1:3], 4, np.s_[1:9:2, ...]]:
                if (
                    full.ndim == 1
                    and isinstance(idx, tuple)
                    and len(idx) > 1
                    and idx[0] is not Ellipsis
                ):
                    continue
                got = s[idx]
                want = np.array(full[idx])
                assert got.shape == want.shape and got.tobytes() == want.tobytes(), (k, idx)
        assert len(files_seen) > 1, "the keys used must span several shards"
        # The same index rules as Reader.get_slice (and safetensors): no lists, no out-of-range.
        with pytest.raises(InvalidSliceError):
            r.get_slice("layers.1.ids")[[1, 2]]
        with pytest.raises(IndexError):
            r.get_slice("layers.1.ids")[100]
        assert r.get_slice("layers.1.ids")[::-7].tolist() == list(range(99, -1, -7))


def test_open_is_lazy_only_the_used_shard_is_read(sharded: str, tmp_path) -> None:
    # A copy where every shard but one is missing: opening and using keys of the present shard
    # works, because nothing else is touched; a key of a missing shard names file and key.
    import shutil

    d = tmp_path / "partial"
    shutil.copytree(sharded, d)
    with open(d / "model.safetensors.index.json") as f:
        weight_map = json.load(f)["weight_map"]
    keep = weight_map["layers.1.ids"]
    for name in set(weight_map.values()) - {keep}:
        os.remove(d / name)
    with sp.open(d) as r:
        assert len(r) == len(weight_map)
        assert np.array_equal(r["layers.1.ids"], np.arange(100))
        gone = next(k for k, v in weight_map.items() if v != keep)
        with pytest.raises(sp.CorruptCheckpointError) as e:
            r[gone]
        assert weight_map[gone] in str(e.value) and repr(gone) in str(e.value)


def test_load_and_prefix(sharded: str) -> None:
    with sp.open(sharded) as r:
        assert r.prefix("layers.1.") == sorted(k for k in r.keys() if k.startswith("layers.1."))
        got = r.load(["layers.1.ids", "embed.weight"])
        assert list(got) == ["layers.1.ids", "embed.weight"]
        allv = r.load()
        assert set(allv) == set(r.keys())
        with pytest.raises(KeyError):
            r["nope"]
        assert r.get("nope", 7) == 7
        r.verify()
        info = r.format_info
        assert info["checksums"] is False and len(info["shards"]) > 3


def test_arrays_are_private_copies_on_write(sharded: str) -> None:
    with sp.open(sharded) as r:
        a = r["layers.1.ids"]
        a[0] = 12345  # a private copy-on-write page: the file is untouched
    with sp.open(sharded) as r:
        assert r["layers.1.ids"][0] == 0


def test_prefix_checkpoint_still_opens_as_shardpoint(tmp_path) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"x": np.arange(3)}, p)
    with sp.open(p) as r:
        assert type(r) is sp.Reader


@pytest.mark.parametrize("io", ["pread", "mmap"])
def test_bf16_and_fp8_directories_read_into_torch_by_either_io(tmp_path, io: str) -> None:
    # io="pread" is what "auto" picks on NFS/FUSE mounts: its fresh arrays are the torch
    # route's carriers (bfloat16/float8 without ml_dtypes), read as bytes, handed out as tensors
    from safetensors.torch import save_file

    import shardpoint.torch as spt

    g = torch.Generator().manual_seed(0)
    state = {
        "w": torch.randn(4, 3, generator=g).bfloat16(),
        "f8": torch.randn(5, generator=g).to(torch.float8_e4m3fn),
        "f": torch.ones(2),
        "e": torch.zeros(0, 3, dtype=torch.bfloat16),
    }
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})

    def same(got: dict) -> bool:
        return all(
            isinstance(got[k], torch.Tensor)
            and got[k].dtype == v.dtype
            and torch.equal(got[k].float(), v.float())
            for k, v in state.items()
        )

    with sp.open(str(tmp_path), framework="pt", io=io) as r:
        assert same(r.load())
        assert same({k: r[k] for k in state})
    assert same(spt.load(str(tmp_path), io=io))
    with sp.open(str(tmp_path), io=io) as r:  # numpy readers keep ml_dtypes' dtypes
        assert str(r["w"].dtype) == "bfloat16" and r["w"].dtype.metadata is None


def test_first_mismatch_checks_a_whole_model_in_one_call(sharded: str) -> None:
    """``load_into``'s one check of every (key, dtype, shape) of a model: the index of the
    first that is not stored as given (missing, other shape, other dtype), else ``None``."""
    sd = {k: v for k, v in _state_dict().items() if k != "lm_head.weight"}  # stored once
    keys = sorted(sd)
    shapes = [tuple(sd[k].shape) for k in keys]
    with sp.open(sharded) as r:
        dtypes = [r.info(k).dtype for k in keys]
        assert r.first_mismatch(keys, dtypes, shapes) is None
        i = keys.index("layers.0.attn.q.weight")
        assert r.first_mismatch(keys, dtypes[:i] + ["float32"] + dtypes[i + 1 :], shapes) == i
        assert r.first_mismatch(keys, dtypes, shapes[:i] + [(32, 31)] + shapes[i + 1 :]) == i
        assert r.first_mismatch([*keys, "nope"], [*dtypes, "float32"], [*shapes, ()]) == len(keys)
