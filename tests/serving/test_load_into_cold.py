"""``load_into`` of files not in the page cache, as the user's next script runs it: a fresh
process builds its model and calls ``shardpoint.torch.load_into(model, path)`` on a Hugging
Face directory, a shardpoint checkpoint (uncompressed, default codec) or a single file.

A read judged cold (``direct_reads.judged_cold``: large enough, files mostly not cached) goes
through the cold-read engine: every value, compressed or not, read with ``O_DIRECT`` (in place
or through the engine's bounce buffers), so the page cache is left as it was; a warm one stays
buffered (docs/SERVING.md, "Issue 41 (twentieth round)"). ``COLD_MIN`` is lowered in the child
(a module constant read at each call) so that a few-MiB model takes the route. Every value is
compared with what was saved; damage and a cut file are named."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import shardpoint.torch as sptorch  # noqa: E402
from page_cache import evict, takes_o_direct  # noqa: E402

_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch
    import shardpoint.torch as sptorch
    from shardpoint.storage import direct_reads
    from shardpoint.storage.io_mode import cached_fraction

    path, files, cold_min = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    direct_reads.COLD_MIN = cold_min

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(1000, 384, dtype=torch.bfloat16)
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(384, 1536, dtype=torch.bfloat16) for _ in range(4)
            )
            self.norm = torch.nn.LayerNorm(384)

    model = Net()
    try:
        missing = sptorch.load_into(model, path)
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        sys.exit(0)
    cached = max(cached_fraction(f) for f in files)  # before anything else reads them
    got = {k: v.view(torch.uint8).reshape(-1).tolist()[:64] + [float(v.float().sum())]
           for k, v in model.state_dict().items()}
    print(json.dumps({"cached": cached, "got": got, "missing": list(missing.missing_keys)}))
    """
)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2026)
    out = {"emb.weight": torch.randn(1000, 384, generator=g).to(torch.bfloat16)}
    for i in range(4):
        out[f"layers.{i}.weight"] = torch.randn(1536, 384, generator=g).to(torch.bfloat16)
        out[f"layers.{i}.bias"] = torch.randn(1536, generator=g).to(torch.bfloat16)
    out["norm.weight"] = torch.randn(384, generator=g)
    out["norm.bias"] = torch.randn(384, generator=g)
    return out


def _summary(state: dict[str, torch.Tensor]) -> dict[str, list]:
    return {
        k: v.view(torch.uint8).reshape(-1).tolist()[:64] + [float(v.float().sum())]
        for k, v in state.items()
    }


def _save(layout: str, d: pathlib.Path, state: dict[str, torch.Tensor]) -> tuple[str, list]:
    """Checkpoint ``state`` in ``layout``; its path and the files holding its values."""
    if layout == "hf":
        model = d / "model"
        model.mkdir()
        names = sorted(state)
        halves = {"model-00001-of-00002.safetensors": names[:5]}
        halves["model-00002-of-00002.safetensors"] = names[5:]
        for fname, keys in halves.items():
            safetensors_torch.save_file({k: state[k] for k in keys}, str(model / fname))
        index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
        (model / "model.safetensors.index.json").write_text(json.dumps(index))
        return str(model), [str(model / f) for f in halves]
    if layout == "single":
        path = d / "model.pt"
        sptorch.save(state, str(path), single_file=True)
        return str(path), [str(path)]
    prefix = d / "ck"
    sptorch.save(state, str(prefix), compression=None if layout == "default" else "none")
    return str(prefix), sorted(str(f) for f in d.glob("ck.data-*"))


def _run(path: str, files: list[str], cold_min: int = 1) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, path, json.dumps(files), str(cold_min)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("layout", ["hf", "none", "default", "single"])
def test_a_fresh_process_loads_a_cold_checkpoint_direct(
    tmp_path: pathlib.Path, layout: str
) -> None:
    """Cold: every value exact and (``O_DIRECT`` taken) the page cache still empty after the
    load; warm, or below ``COLD_MIN``: the same values, read buffered (the files cached)."""
    state = _state()
    path, files = _save(layout, tmp_path, state)
    want = _summary(state)
    cold = evict(*files)
    out = _run(path, files)
    assert out["missing"] == [] and out["got"] == want
    if cold and all(takes_o_direct(f) for f in files):
        # a buffered read (the kernel's read-ahead) would have left the files cached
        assert out["cached"] < 0.25, out["cached"]
    evict(*files)
    out = _run(path, files, cold_min=1 << 40)  # too small to pay: the buffered engine
    assert out["got"] == want and out["cached"] > 0.5, out["cached"]


@pytest.mark.parametrize("layout", ["hf", "none"])
def test_a_cold_direct_load_names_damage_and_a_cut_file(
    tmp_path: pathlib.Path, layout: str
) -> None:
    """On the cold route: a flipped byte in an uncompressed shardpoint value raises
    ``ChecksumMismatchError`` naming the key (safetensors files have no checksums to check);
    a file cut short since it was written is refused naming it, never a SIGBUS."""
    state = _state()
    path, files = _save(layout, tmp_path, state)
    if layout == "none":
        import shardpoint as sp

        with sp.open(path) as r:
            info = r.info("layers.2.weight")
        shard = pathlib.Path(files[info.shard])
        data = bytearray(shard.read_bytes())
        data[info.offset + info.stored_bytes // 3] ^= 0x04
        shard.write_bytes(bytes(data))
        evict(*files)
        out = _run(path, files)
        assert out.get("error") == "ChecksumMismatchError", out
        assert "layers.2.weight" in out["message"]
        shard.write_bytes(bytes(data[: len(data) // 2]))
    else:
        cut = pathlib.Path(files[-1])
        cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    evict(*files)
    out = _run(path, files)
    assert out.get("error") in {"CorruptCheckpointError", "ChecksumMismatchError"}, out
    assert pathlib.Path(files[-1] if layout == "hf" else files[0]).name in out["message"]
