"""Loading bfloat16/float8 checkpoints into torch never imports ``ml_dtypes``.

Why: ``import ml_dtypes`` (0.7) takes ~0.8 s, its extension registering every type's ufunc
loops. The torch routes used to decode such values into ``ml_dtypes`` arrays only to view them
as torch dtypes again, so every fresh process loading a bfloat16 model paid it: in the cold
serving bench it ran in the reading thread, holding the GIL, and halved the load rate. Each
route runs in a fresh process, as a user's next script does, and checks the values exactly;
a numpy leaf the user saved still comes back with its numpy (``ml_dtypes``) dtype."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402

_DTYPES = [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        f"w_{str(d).split('.')[-1]}": torch.randn(33, 17, generator=g).to(d) for d in _DTYPES
    } | {"empty": torch.zeros(0, 4, dtype=torch.bfloat16), "scalar": torch.tensor(1.5).bfloat16()}


_ROUTES = {
    "torch.load": "out = torch.load(P)",
    "spt.load": "out = spt.load(P)",
    "spt.load mmap": "out = spt.load(P, mmap=True)",
    "load_into": "m = {k: torch.empty_like(v) for k, v in ref.items()}; "
    "spt.load_into(m, P); out = m",
    "weights_iterator": "out = dict(spt.weights_iterator(P))",
    "open pt": "r = sp.open(P, framework='pt'); out = {k: r[k] for k in r.keys()}",
}

_SCRIPT = """
import json, sys
import torch, shardpoint as sp, shardpoint.torch as spt
P = sys.argv[1]
ref = torch.load(sys.argv[2], weights_only=True)  # torch's own file: the expected values
{route}
same = {{k: bool(out[k].dtype == v.dtype and out[k].shape == v.shape
               and torch.equal(out[k].reshape(-1).view(torch.uint8),
                               v.reshape(-1).view(torch.uint8)))
         for k, v in ref.items()}}
print(json.dumps({{"ml_dtypes": "ml_dtypes" in sys.modules, "same": same}}))
"""


@pytest.mark.parametrize("route", sorted(_ROUTES))
def test_a_torch_route_loads_exact_values_without_importing_ml_dtypes(
    tmp_path: Path, route: str
) -> None:
    state = _state()
    prefix = str(tmp_path / "ck")
    spt.save(state, prefix)
    torch.save(state, tmp_path / "ref.pt")
    script = textwrap.dedent(_SCRIPT.format(route=_ROUTES[route]))
    out = subprocess.run(
        [sys.executable, "-c", script, prefix, str(tmp_path / "ref.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"] == dict.fromkeys(state, True)
    assert got["ml_dtypes"] is False


def test_numpy_leaves_and_numpy_readers_keep_their_ml_dtypes(tmp_path: Path) -> None:
    arr = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3)
    prefix = str(tmp_path / "ck")
    spt.save({"np": arr, "t": torch.ones(2, dtype=torch.bfloat16)}, prefix)
    out = spt.load(prefix)
    assert out["np"].dtype == np.dtype(ml_dtypes.bfloat16) and out["np"].dtype.metadata is None
    np.testing.assert_array_equal(out["np"], arr)
    assert out["t"].dtype == torch.bfloat16
    plain = sp.load_file(prefix)
    assert plain["np"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert plain["t"].dtype == np.dtype(ml_dtypes.bfloat16) and plain["t"].dtype.metadata is None


_SAVE_SCRIPT = """
import json, sys
import torch, shardpoint.torch as spt
import torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(0)
state = {"w": torch.randn(8, 5, generator=g).bfloat16(),
         "f8": torch.randn(7, generator=g).to(torch.float8_e5m2),
         "t": torch.randn(5, 8, generator=g).bfloat16().t()}  # not contiguous
spt.save(state, sys.argv[1] + "/ck")
back = spt.load(sys.argv[1] + "/ck")
dcp.save(state, storage_writer=spt.StorageWriter(sys.argv[1] + "/dcp"))
into = {k: torch.zeros_like(v) for k, v in state.items()}
dcp.load(into, storage_reader=spt.StorageReader(sys.argv[1] + "/dcp"))
same = all(torch.equal(o[k].float(), state[k].float()) and o[k].dtype == state[k].dtype
           for o in (back, into) for k in state)
print(json.dumps({"ml_dtypes": "ml_dtypes" in sys.modules, "same": same}))
"""


def test_saves_and_dcp_round_trips_without_importing_ml_dtypes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SAVE_SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ml_dtypes": False, "same": True}
    # and the files hold the real dtypes: a numpy reader (which does import ml_dtypes) agrees
    got = sp.load_file(str(tmp_path / "ck"))
    assert {k: str(v.dtype) for k, v in got.items()} == {
        "w": "bfloat16",
        "f8": "float8_e5m2",
        "t": "bfloat16",
    }
