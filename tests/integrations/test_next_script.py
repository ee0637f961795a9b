"""The user's next script, in a fresh process: a Lightning run saved with the one line
(``Trainer(plugins=[ShardpointCheckpointIO()])``), then an evaluation script that imports only
Lightning and the user's own model — never shardpoint — and reads the checkpoint every way
Lightning users do: ``MyModel.load_from_checkpoint``, ``torch.load`` (``weights_only`` True,
False and torch's default, ``map_location``, a file object), ``Trainer.fit/validate(ckpt_path=)``
without the plugin, ``Fabric.load``. The same with ``import shardpoint`` first; with the
reading turned off (``SHARDPOINT_TORCH_LOAD=0``) the error names shardpoint and the call that
works. Real Lightning, real processes (the hook is the site-packages startup file the wheel
ships, which ``make`` puts in the development environment too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

#: the user's own module: their class, their data, nothing of shardpoint's
USER_MODEL = """
import torch
import lightning as L


class MyModel(L.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )


def quiet():
    return dict(logger=False, enable_progress_bar=False, enable_model_summary=False)
"""

TRAIN = """
import hashlib, json, sys
import lightning as L
import mymodel
from shardpoint.integrations.lightning import ShardpointCheckpointIO

trainer = L.Trainer(max_epochs=2, plugins=[ShardpointCheckpointIO()], default_root_dir=sys.argv[1],
                    **mymodel.quiet())
model = mymodel.MyModel(hidden=6)
trainer.fit(model, mymodel.data())
path = sys.argv[1] + "/final.ckpt"
trainer.save_checkpoint(path)
weights = {k: v.detach().numpy().tobytes().hex() for k, v in model.state_dict().items()}
print(json.dumps({"path": path, "weights": weights}))
"""

#: the evaluation script: Lightning and the user's module only (``FIRST`` may add an import)
EVAL = """
import json, sys
FIRST
import torch
import lightning as L
import mymodel

path = sys.argv[1]
out = {}
model = mymodel.MyModel.load_from_checkpoint(path)
out["hparams"] = dict(model.hparams)
out["weights"] = {k: v.detach().numpy().tobytes().hex() for k, v in model.state_dict().items()}
for name, kw in [("wo_true", {"weights_only": True}), ("wo_false", {"weights_only": False}),
                 ("default", {}), ("map_cpu", {"map_location": "cpu"}),
                 ("map_device", {"map_location": torch.device("cpu")})]:
    ckpt = torch.load(path, **kw)
    out[name] = [sorted(ckpt), ckpt["global_step"], ckpt["state_dict"]["net.0.weight"].numpy().tobytes().hex()]
with open(path, "rb") as f:
    out["file_object"] = sorted(torch.load(f, map_location="cpu"))
trainer = L.Trainer(max_epochs=3, default_root_dir=sys.argv[2], **mymodel.quiet())
trainer.fit(mymodel.MyModel(hidden=6), mymodel.data(), ckpt_path=path)
out["resumed_epoch"] = trainer.current_epoch
out["validate"] = trainer.validate(mymodel.MyModel(hidden=6), mymodel.data(), ckpt_path=path, verbose=False)
state = L.Fabric(accelerator="cpu").load(path)
out["fabric"] = sorted(state)
print(json.dumps(out))
"""


def _run(code: str, cwd: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(cwd), *filter(None, [full.get("PYTHONPATH")])])
    full.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
    )
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("next_script")
    (root / "mymodel.py").write_text(USER_MODEL)
    proc = _run(TRAIN, root, str(root / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["path"]).read_bytes()[:8] == b"SPSINGLE"  # our file, not a pickle
    return {"root": root, **out}


@pytest.mark.parametrize("first", ["", "import shardpoint"], ids=["lightning-only", "import-sp"])
def test_eval_script_reads_the_checkpoint_every_way(trained: dict[str, Any], first: str) -> None:
    root = trained["root"]
    proc = _run(EVAL.replace("FIRST", first), root, trained["path"], str(root / f"eval{first!r}"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ("shardpoint" in EVAL.replace("FIRST", first)) is bool(first)
    assert out["hparams"] == {"hidden": 6, "lr": 0.1}
    assert out["weights"] == trained["weights"]  # bit for bit what the training run held
    expected_keys = None
    for name in ("wo_true", "wo_false", "default", "map_cpu", "map_device"):
        keys, step, w0 = out[name]
        assert "state_dict" in keys and "optimizer_states" in keys and "hyper_parameters" in keys
        assert step == 8
        assert w0 == trained["weights"]["net.0.weight"]
        assert expected_keys in (None, keys)
        expected_keys = keys
    assert out["file_object"] == expected_keys
    assert out["resumed_epoch"] == 3
    assert out["validate"][0]["val_loss"] >= 0.0
    assert "state_dict" in out["fabric"] and "loops" in out["fabric"]


def test_reading_turned_off_names_shardpoint(trained: dict[str, Any]) -> None:
    code = "import sys, torch; torch.load(sys.argv[1])"
    proc = _run(code, trained["root"], trained["path"], env={"SHARDPOINT_TORCH_LOAD": "0"})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "UnpicklingError" in last and "shardpoint checkpoint" in last
    assert "shardpoint.torch.load" in last


def test_other_files_are_torchs(tmp_path: Path) -> None:
    """A native torch.save file, a missing path and a directory behave exactly as in torch."""
    native = tmp_path / "native.pt"
    torch.save({"w": torch.arange(3)}, native)
    code = """
import sys, torch
print(torch.load(sys.argv[1])["w"].tolist())
for bad in (sys.argv[2], sys.argv[3]):
    try:
        torch.load(bad)
    except Exception as e:
        print(type(e).__name__)
print(getattr(torch.load, "__wrapped__", None) is not None)
"""
    proc = _run(code, tmp_path, str(native), str(tmp_path / "missing.pt"), str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [
        "[0,",
        "1,",
        "2]",
        "FileNotFoundError",
        "IsADirectoryError",
        "True",
    ]


SURGERY = """
import shutil, sys, torch
import mymodel

path, other = sys.argv[1], sys.argv[2]
shutil.copy(path, other)
ckpt = torch.load(path, map_location="cpu")          # torch's default: no mmap
ckpt["state_dict"]["net.0.weight"] += 1.0
ckpt["hyper_parameters"]["lr"] = 0.5
torch.save(ckpt, path)                                 # over the very file it read
model = mymodel.MyModel.load_from_checkpoint(path)
print(model.hparams.lr, float(model.net[0].weight.sum()))
again = torch.load(other)
shutil.copy(path, other)                               # truncates `other` under `again`
print(float(again["state_dict"]["net.0.weight"].sum()))
"""


def test_surgery_script_saves_over_the_file_it_read(trained: dict[str, Any]) -> None:
    """Load a checkpoint, edit it, ``torch.save`` it to the same path (what upstream
    Lightning's ``test_load_from_checkpoint_warn_on_empty_state_dict`` does): the tensors
    ``torch.load`` gave must outlive the file, as torch's own do. They were views of the mapped
    file, and the truncation killed the process with SIGBUS."""
    root = trained["root"]
    path = root / "surgery.ckpt"
    path.write_bytes(Path(trained["path"]).read_bytes())
    proc = _run(SURGERY, root, str(path), str(root / "surgery-copy.ckpt"))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    lr, edited, kept = (float(v) for v in proc.stdout.split())
    w0 = torch.frombuffer(
        bytearray.fromhex(trained["weights"]["net.0.weight"]), dtype=torch.float32
    )
    assert lr == 0.5
    assert edited == pytest.approx(float(w0.sum()) + w0.numel(), rel=1e-5)
    assert kept == pytest.approx(float(w0.sum()), rel=1e-5)
    assert path.read_bytes()[:8] != b"SPSINGLE"  # torch.save wrote its own format there
