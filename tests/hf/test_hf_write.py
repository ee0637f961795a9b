"""``sp.export_hf`` / ``shardpoint convert --to hf``, checked against the real clients.

What we write must load with ``huggingface_hub.load_torch_model`` / ``load_state_dict_from_file``
and ``safetensors.safe_open`` bit for bit, and be split and named exactly as
``huggingface_hub.save_torch_state_dict`` splits and names the same state dict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch models are what the hub loads into")
hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is the reader under test")
from safetensors import safe_open  # noqa: E402

import shardpoint as sp  # noqa: E402
from shardpoint.convert.hf_export import parse_size, plan_shards  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 24)
        self.proj = torch.nn.Linear(24, 40).to(torch.bfloat16)
        self.head = torch.nn.Linear(40, 10)
        self.norm = torch.nn.LayerNorm(10).to(torch.float16)
        self.register_buffer("steps", torch.arange(7, dtype=torch.int64))
        self.register_buffer("w8", torch.randn(16, 8).to(torch.float8_e4m3fn))


def _np(t: torch.Tensor) -> np.ndarray:
    """Exact numpy copy of a tensor (bf16/fp8 through their bytes)."""
    import ml_dtypes

    names = {
        torch.bfloat16: ml_dtypes.bfloat16,
        torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
        torch.float8_e5m2: ml_dtypes.float8_e5m2,
    }
    t = t.detach().contiguous()
    if t.dtype in names:
        raw = t.reshape(-1).view(torch.uint8).numpy()
        return raw.view(names[t.dtype]).reshape(tuple(t.shape))
    return t.numpy().copy()


def _tbytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture()
def net_ckpt(tmp_path) -> tuple[Net, str]:
    torch.manual_seed(0)
    net = Net()
    prefix = str(tmp_path / "ck")
    sp.save_file({k: _np(v) for k, v in net.state_dict().items()}, prefix, metadata={"step": 3})
    return net, prefix


def test_split_and_names_match_save_torch_state_dict(net_ckpt, tmp_path) -> None:
    net, prefix = net_ckpt
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    theirs.mkdir()
    sd = dict(sorted(net.state_dict().items()))  # the order a shardpoint checkpoint lists keys in
    hub.save_torch_state_dict(sd, theirs, max_shard_size="2KB")
    res = sp.export_hf(prefix, ours, max_shard_size="2KB")
    assert res.entries == len(sd)
    names = sorted(os.listdir(theirs))
    assert sorted(os.listdir(ours)) == names
    assert len(names) > 3
    ours_idx = json.loads((ours / "model.safetensors.index.json").read_text())
    theirs_idx = json.loads((theirs / "model.safetensors.index.json").read_text())
    assert ours_idx["weight_map"] == theirs_idx["weight_map"]
    assert list(ours_idx["weight_map"]) == list(theirs_idx["weight_map"])
    assert ours_idx["metadata"]["total_size"] == theirs_idx["metadata"]["total_size"]
    assert ours_idx["metadata"]["step"] == "3"  # carried over, as str (the hub's metadata type)
    for n in names:
        if n.endswith(".safetensors"):
            with (
                safe_open(ours / n, framework="pt") as a,
                safe_open(theirs / n, framework="pt") as b,
            ):
                assert sorted(a.keys()) == sorted(b.keys())
                assert a.metadata() == b.metadata() == {"format": "pt"}
                for k in a.keys():
                    assert _tbytes(a.get_tensor(k)) == _tbytes(b.get_tensor(k)), k


def test_plan_matches_hub_split_function() -> None:
    # The split function itself, on sizes that exercise every branch (oversized tensor alone,
    # exact fit, overflow), compared with huggingface_hub's own.
    from huggingface_hub import split_torch_state_dict_into_shards

    from shardpoint.convert.base import Spec

    sizes = [600, 400, 1200, 100, 900, 1000, 1, 999, 1000, 0, 50]
    sd = {f"t{i:02d}": torch.zeros(n, dtype=torch.uint8) for i, n in enumerate(sizes)}
    for limit in (1000, "1KB", 2000, 10**6):
        split = split_torch_state_dict_into_shards(sd, max_shard_size=limit)
        plan = plan_shards(
            [Spec(k, "uint8", (v.numel(),), v.numel()) for k, v in sd.items()], parse_size(limit)
        )
        assert [[s.key for s in shard] for shard in plan] == list(
            split.filename_to_tensors.values()
        )


def test_loads_with_load_torch_model_bit_for_bit(net_ckpt, tmp_path) -> None:
    net, prefix = net_ckpt
    out = tmp_path / "hf"
    sp.export_hf(prefix, out, max_shard_size="1KB")
    fresh = Net()
    for p in fresh.parameters():
        torch.nn.init.zeros_(p)
    fresh.steps.zero_()
    res = hub.load_torch_model(fresh, out, strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    for k, v in net.state_dict().items():
        got = fresh.state_dict()[k]
        assert got.dtype == v.dtype and _tbytes(got) == _tbytes(v), k


def test_single_file_loads_with_load_state_dict_from_file(net_ckpt, tmp_path) -> None:
    net, prefix = net_ckpt
    out = tmp_path / "hf1"
    with sp.open(prefix) as r:  # an open Reader works as a source too
        sp.export_hf(r, out)
    assert os.listdir(out) == ["model.safetensors"]
    sd = hub.load_state_dict_from_file(out / "model.safetensors")
    assert set(sd) == set(net.state_dict())
    for k, v in net.state_dict().items():
        assert _tbytes(sd[k]) == _tbytes(v)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt", "step": "3"}


def test_hf_roundtrip_through_shardpoint(tmp_path) -> None:
    torch.manual_seed(1)
    sd = dict(sorted(Net().state_dict().items()))
    src = tmp_path / "src"
    src.mkdir()
    hub.save_torch_state_dict(sd, src, max_shard_size="1KB")
    prefix = str(tmp_path / "sp")
    res = sp.convert.convert(str(src), prefix)
    assert res.src_format == "hf" and res.entries == len(sd)
    with sp.open(prefix) as r:
        r.verify()  # now checksummed
        for k, v in sd.items():
            assert r[k].tobytes() == _tbytes(v)
    back = tmp_path / "back"
    sp.export_hf(prefix, back, max_shard_size="1KB")
    a = json.loads((src / "model.safetensors.index.json").read_text())
    b = json.loads((back / "model.safetensors.index.json").read_text())
    assert a["weight_map"] == b["weight_map"]
    assert a["metadata"] == b["metadata"]


def test_export_is_atomic_on_failure(net_ckpt, tmp_path, monkeypatch) -> None:
    _, prefix = net_ckpt
    out = tmp_path / "out"
    from shardpoint.convert import shardpoint_io

    calls = {"n": 0}
    real = shardpoint_io.ShardpointSource.read

    def failing(self, key):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("disk on fire")
        return real(self, key)

    monkeypatch.setattr(shardpoint_io.ShardpointSource, "read", failing)
    with pytest.raises(OSError, match="disk on fire"):
        sp.export_hf(prefix, out, max_shard_size="1KB")
    assert calls["n"] == 4
    assert not out.exists()
    # Nothing but the source checkpoint is left: no partial directory, no temp directory.
    assert all(n.startswith("ck.") for n in os.listdir(tmp_path)), os.listdir(tmp_path)


def test_export_refuses_nonempty_dir_unless_overwrite(net_ckpt, tmp_path) -> None:
    _, prefix = net_ckpt
    out = tmp_path / "out"
    out.mkdir()
    sp.export_hf(prefix, out)  # an empty directory is fine
    with pytest.raises(sp.InvalidArgumentError, match="not empty"):
        sp.export_hf(prefix, out, max_shard_size="1KB")
    sp.export_hf(prefix, out, max_shard_size="1KB", overwrite=True)
    assert "model.safetensors" not in os.listdir(out)
    assert "model.safetensors.index.json" in os.listdir(out)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".out")]


def test_non_tensors_are_skipped_with_a_note(tmp_path) -> None:
    prefix = str(tmp_path / "ck")
    sp.save_file({"w": np.ones(3, np.float32), "step": 5, "name": "x"}, prefix)
    res = sp.export_hf(prefix, tmp_path / "o")
    assert res.entries == 1 and len(res.notes) == 2
    with sp.open(tmp_path / "o") as r:
        assert r.keys() == ["w"]


def test_bad_max_shard_size(net_ckpt, tmp_path) -> None:
    _, prefix = net_ckpt
    for bad in ("5XB", "GB", 0, -3, "0MB"):
        with pytest.raises(sp.InvalidArgumentError):
            sp.export_hf(prefix, tmp_path / "o", max_shard_size=bad)
    assert parse_size("5GB") == 5 * 10**9 and parse_size("1.5MB") == 1_500_000


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardpoint", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_convert_both_ways_and_ls(net_ckpt, tmp_path) -> None:
    net, prefix = net_ckpt
    out = tmp_path / "hfdir"
    p = _cli("convert", prefix, str(out), "--to", "hf", "--max-shard-size", "1KB", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "-> hf" in p.stdout
    assert (out / "model.safetensors.index.json").exists()
    back = str(tmp_path / "back")
    p = _cli("convert", str(out), back, "--progress")
    assert p.returncode == 0, p.stderr
    assert "converted hf -> shardpoint" in p.stdout
    with sp.open(back) as r:
        for k, v in net.state_dict().items():
            assert r[k].tobytes() == _tbytes(v)
    p = _cli("ls", str(out))
    assert p.returncode == 0, p.stderr
    assert "proj.weight" in p.stdout and "bfloat16" in p.stdout
    p = _cli("convert", prefix, str(out), "--to", "hf")
    assert p.returncode == 2 and "exists" in p.stderr


def test_hf_to_shardpoint_streams_shard_by_shard_with_a_bar(tmp_path, monkeypatch) -> None:
    torch.manual_seed(2)
    sd = {f"l{i}.w": torch.randn(40, 40) for i in range(8)}
    src = tmp_path / "src"
    src.mkdir()
    hub.save_torch_state_dict(sd, src, max_shard_size="14KB")
    from shardpoint.convert import hf as hf_mod
    from shardpoint.convert import shardpoint_io

    mapped_max = {"n": 0}
    real_read = hf_mod.HFSource.read

    def read(self, key):  # type: ignore[no-untyped-def]
        out = real_read(self, key)
        mapped_max["n"] = max(mapped_max["n"], len(self.reader._shards))
        return out

    bars = []

    class Bar:
        def __init__(self, total, desc, progress=None):  # type: ignore[no-untyped-def]
            self.total, self.n, self.progress = total, 0, progress
            bars.append(self)

        def update(self, n):  # type: ignore[no-untyped-def]
            self.n += n

        def close(self) -> None:
            pass

    monkeypatch.setattr(hf_mod.HFSource, "read", read)
    monkeypatch.setattr(shardpoint_io, "progress_bar", Bar)
    res = sp.convert.convert(str(src), str(tmp_path / "sp"), progress=True)
    assert res.entries == 8 and len([n for n in os.listdir(src) if n.endswith(".safetensors")]) == 4
    assert mapped_max["n"] == 1  # one shard mapped at a time
    assert len(bars) == 1 and bars[0].progress is True
    assert bars[0].total == bars[0].n == 8 * 40 * 40 * 4


def test_cli_verify_and_info_on_an_hf_directory(tmp_path) -> None:
    d = tmp_path / "hf"
    d.mkdir()
    hub.save_torch_state_dict(
        {f"l{i}.w": torch.ones(50, 50) for i in range(4)}, d, max_shard_size="12KB"
    )
    p = _cli("verify", str(d))
    assert p.returncode == 0 and "structure checked" in p.stdout and "no checksums" in p.stdout
    p = _cli("info", str(d), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["entries"] == 4 and doc["checksums"] is False and len(doc["shards"]) == 4
    os.remove(d / "model-00003-of-00004.safetensors")
    p = _cli("verify", str(d))
    assert p.returncode == 1 and "model-00003-of-00004.safetensors" in p.stderr
    assert "Traceback" not in p.stderr
