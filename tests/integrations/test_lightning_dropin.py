"""Lightning with the one line alone (``Trainer(plugins=[ShardpointCheckpointIO()])``, no
mixin): the checkpoint is one file where Lightning put it, every Lightning API that reads a
checkpoint reads it, the plugin pickles, OmegaConf configs round-trip, URLs go where they
name (fsspec's memory://, S3 through the core against a moto server), Lightning's own files
resume safely, Lightning's error wording. Real Lightning on the CPU."""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")
omegaconf = pytest.importorskip("omegaconf")

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import shardpoint as sp  # noqa: E402
from integration_helpers import lightning_run  # noqa: E402
from integration_helpers.common import assert_same_tree  # noqa: E402
from integration_helpers.lightning_run import PlainNet, loader  # noqa: E402
from shardpoint.integrations.lightning import (  # noqa: E402
    ShardpointCheckpointIO,
    load_checkpoint,
)


class EvalNet(PlainNet):
    """The run's module with evaluation and prediction steps."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return self(batch[0])


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> Any:
        return loader()

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


class CfgNet(PlainNet):
    """Configured the Hydra way: ``save_hyperparameters(cfg)`` with an OmegaConf config."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(hidden=cfg.model.hidden, lr=cfg.optim.lr)
        self.save_hyperparameters(cfg)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.optim.lr)


def trainer(root: Path | str, *plugins: Any, **kw: Any) -> L.Trainer:
    args: dict[str, Any] = {
        "default_root_dir": str(root),
        "max_epochs": 1,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "plugins": list(plugins),
    }
    args.update(kw)
    return L.Trainer(**args)


def fit(t: L.Trainer, model: Any, **kw: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(model, **kw)


def params(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch with a datamodule, through the plugin."""
    root = tmp_path_factory.mktemp("fitted")
    torch.manual_seed(0)
    model = EvalNet()
    ckpt = ModelCheckpoint(dirpath=root / "ckpts", save_last=True)
    fit(trainer(root, ShardpointCheckpointIO(), callbacks=[ckpt]), model, datamodule=Data())
    return {"root": root, "path": ckpt.best_model_path, "params": params(model)}


def test_checkpoint_is_one_file_at_the_path_lightning_chose(
    fitted: dict[str, Any], tmp_path: Path
) -> None:
    path = Path(fitted["path"])
    assert path.name == "epoch=0-step=4.ckpt" and path.is_file()
    assert sorted(os.listdir(path.parent)) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    with sp.open(str(path)) as r:  # a shardpoint single file, found by its content
        assert r.metadata == {"shardpoint.integration": "lightning"}
    copy = tmp_path / "copied.ckpt"  # users copy, upload and log checkpoints as one file
    shutil.copy(path, copy)
    assert_same_tree(load_checkpoint(copy)["state_dict"], fitted["params"])


def test_plugin_pickles_with_its_settings_and_a_save_in_flight(tmp_path: Path) -> None:
    plugin = ShardpointCheckpointIO(blocking=False, compression=None, level=3)
    plugin.save_checkpoint({"w": torch.arange(1 << 16, dtype=torch.float32)}, tmp_path / "a.ckpt")
    clone = pickle.loads(pickle.dumps(plugin))  # what ddp_spawn does with the strategy
    plugin.wait()
    assert (clone.blocking, clone.compression, clone.level) == (False, None, 3)
    clone.save_checkpoint({"w": torch.ones(3)}, tmp_path / "b.ckpt")
    clone.wait()
    assert torch.equal(
        clone.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.arange(1 << 16, dtype=torch.float32)
    )
    assert torch.equal(plugin.load_checkpoint(tmp_path / "b.ckpt")["w"], torch.ones(3))


def test_every_reading_api_with_the_one_line_alone(fitted: dict[str, Any], tmp_path: Path) -> None:
    path, saved = fitted["path"], fitted["params"]
    # classmethods Lightning gives no plugin to, on a module without the mixin
    model = EvalNet.load_from_checkpoint(path)
    assert_same_tree(params(model), saved)
    assert Data.load_from_checkpoint(path).hparams.batch_size == 4
    with open(path, "rb") as f:  # a file object, as Lightning's loader takes too
        assert_same_tree(params(EvalNet.load_from_checkpoint(f)), saved)
    # Trainer.validate/test/predict(ckpt_path=...) restore the weights into a fresh module
    for fn in ("validate", "test", "predict"):
        fresh = EvalNet(hidden=16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(trainer(tmp_path, ShardpointCheckpointIO()), fn)(
                fresh, datamodule=Data(), ckpt_path=path
            )
        assert_same_tree(params(fresh), saved)
    # Trainer.fit(ckpt_path=...) resumes where the checkpoint stopped
    resumed = trainer(tmp_path, ShardpointCheckpointIO(), max_epochs=2, enable_checkpointing=False)
    fresh = EvalNet()
    fit(resumed, fresh, datamodule=Data(), ckpt_path=path)
    assert resumed.global_step == 8 and len(fresh.losses) == 4


def test_fabric_saves_and_loads(tmp_path: Path) -> None:
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[ShardpointCheckpointIO()])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model.weight.grad = torch.ones_like(model.weight)
    opt.step()
    path = tmp_path / "fabric.ckpt"
    fabric.save(path, {"model": model, "optimizer": opt, "step": 7})
    assert path.is_file() and sp.open(str(path)).metadata["shardpoint.integration"] == "lightning"
    for plugins in ([ShardpointCheckpointIO()], []):  # through the plugin, and Lightning's own IO
        other = torch.nn.Linear(4, 2)
        other_opt = torch.optim.AdamW(other.parameters())
        state = {"model": other, "optimizer": other_opt}
        rest = L.Fabric(accelerator="cpu", devices=1, plugins=plugins).load(path, state)
        assert rest == {"step": 7}
        assert_same_tree(params(other), params(model))
        assert_same_tree(other_opt.state_dict(), opt.state_dict())


def test_lightning_files_still_load_through_lightning_with_the_reader_installed(
    tmp_path: Path,
) -> None:
    ShardpointCheckpointIO()  # the reader is in front of Lightning's loader
    torch.manual_seed(0)
    model = EvalNet()
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    fit(trainer(tmp_path, callbacks=[ckpt]), model, datamodule=Data())  # Lightning's own IO
    with open(ckpt.last_model_path, "rb") as f:
        assert f.read(2) == b"PK"  # torch.save's zip
        f.seek(0)
        native = io.BytesIO(f.read())
    assert_same_tree(params(EvalNet.load_from_checkpoint(ckpt.last_model_path)), params(model))
    assert_same_tree(params(EvalNet.load_from_checkpoint(native)), params(model))


def test_resume_from_a_native_ckpt_then_save_shardpoint(tmp_path: Path) -> None:
    """A run started before the plugin was added resumes with it (the native file read with
    torch.load(weights_only=True)) and continues exactly; its next checkpoints are ours."""
    first = lightning_run.train("native", str(tmp_path / "a"), epochs=1)
    native_ckpt = tmp_path / "a" / "ckpts" / "last.ckpt"
    with open(native_ckpt, "rb") as f:
        assert f.read(2) == b"PK"
    resumed = lightning_run.train("shardpoint", str(tmp_path / "b"), 2, resume=str(native_ckpt))
    straight = lightning_run.train("native", str(tmp_path / "c"), epochs=2)
    assert first["losses"] + resumed["losses"] == straight["losses"]
    assert resumed["digest"] == straight["digest"]
    written = tmp_path / "b" / "ckpts" / "last.ckpt"
    assert sp.open(str(written)).metadata == {"shardpoint.integration": "lightning"}
    assert load_checkpoint(written)["global_step"] == 8


class _Planted:
    """A pickle that would create a file when unpickled (a stand-in for running code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


def test_native_ckpt_is_never_unpickled_beyond_weights_only(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    bad = tmp_path / "planted.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": _Planted(marker)}}, bad)
    with pytest.raises(pickle.UnpicklingError, match="weights_only=True.*add_safe_globals"):
        ShardpointCheckpointIO().load_checkpoint(bad, weights_only=False)
    with pytest.raises(pickle.UnpicklingError, match="weights_only=True"):
        fit(trainer(tmp_path, ShardpointCheckpointIO()), PlainNet(), train_dataloaders=loader(),
            ckpt_path=bad)  # fmt: skip
    assert not marker.exists()


def test_omegaconf_config_and_hparams_type_round_trip(tmp_path: Path) -> None:
    cfg = omegaconf.OmegaConf.create(
        {"model": {"hidden": 8}, "optim": {"lr": 0.01}, "name": "run-${model.hidden}"}
    )
    model = CfgNet(cfg)
    t = trainer(tmp_path, ShardpointCheckpointIO(), callbacks=[ModelCheckpoint(tmp_path)])
    fit(t, model, train_dataloaders=loader())
    ckpt = load_checkpoint(t.checkpoint_callback.best_model_path)
    assert ckpt["hparams_type"] is omegaconf.DictConfig
    assert isinstance(ckpt["hyper_parameters"], omegaconf.DictConfig)
    back = CfgNet.load_from_checkpoint(t.checkpoint_callback.best_model_path)
    assert isinstance(back.hparams, omegaconf.DictConfig)
    assert back.hparams.name == "run-8" and back.hparams.optim.lr == 0.01
    assert_same_tree(params(back), params(model))


def test_fsspec_memory_url(tmp_path: Path, monkeypatch: Any) -> None:
    import fsspec

    monkeypatch.chdir(tmp_path)  # a local folder named after the scheme would appear here
    root = f"memory://sp-{uuid.uuid4().hex[:8]}"
    ckpt = ModelCheckpoint(dirpath=f"{root}/ckpts", save_last=True)
    fit(trainer(root, ShardpointCheckpointIO(), callbacks=[ckpt]), EvalNet(), datamodule=Data())
    fs = fsspec.filesystem("memory")
    last = f"{root}/ckpts/last.ckpt"
    with fs.open(last, "rb") as f:
        assert f.read(8) == b"SPSINGLE"
    assert os.listdir(tmp_path) == []
    again = ModelCheckpoint(dirpath=f"{root}/ckpts", save_last=True)
    t = trainer(root, ShardpointCheckpointIO(), callbacks=[again], max_epochs=2)
    model = EvalNet()
    # (ckpt_path="last" finds nothing on memory://, with Lightning's own checkpointing too: its
    # lookup drops the URL's protocol)
    fit(t, model, datamodule=Data(), ckpt_path=last)
    assert t.global_step == 8 and len(model.losses) == 4
    assert_same_tree(params(EvalNet.load_from_checkpoint(last)), params(model))
    with pytest.raises(sp.InvalidArgumentError, match="nosuchproto://"):
        t.save_checkpoint("nosuchproto://bucket/x.ckpt")
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def moto() -> Iterator[Any]:
    pytest.importorskip("moto.server")
    from s3_server import moto_environment

    with moto_environment() as m:
        yield m


def test_s3_url_goes_through_the_core(moto: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    bucket = moto.bucket()
    url = f"s3://{bucket}/run/epoch.ckpt"
    torch.manual_seed(0)
    model = EvalNet()
    t = trainer(tmp_path, ShardpointCheckpointIO(), enable_checkpointing=False)
    fit(t, model, datamodule=Data())
    t.save_checkpoint(url)
    shard, index = moto.keys(bucket)  # the prefix form (FORMAT.md §8.2): shard, then index
    assert (
        shard.startswith("run/epoch.ckpt.data-00000-of-00001.") and index == "run/epoch.ckpt.index"
    )
    assert os.listdir(tmp_path) == []  # nothing local, no folder named "s3:"
    assert_same_tree(params(EvalNet.load_from_checkpoint(url)), params(model))
    resumed = trainer(tmp_path, ShardpointCheckpointIO(), max_epochs=2, enable_checkpointing=False)
    fresh = EvalNet()
    fit(resumed, fresh, datamodule=Data(), ckpt_path=url)
    assert resumed.global_step == 8 and len(fresh.losses) == 4
    resumed.strategy.remove_checkpoint(url)
    assert moto.keys(bucket) == []
    with pytest.raises(FileNotFoundError, match=re.escape(f"Checkpoint file not found: {url}")):
        load_checkpoint(url)


def test_missing_checkpoint_is_worded_as_lightning_words_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.ckpt"
    for plugins in ([ShardpointCheckpointIO()], []):
        with pytest.raises(
            FileNotFoundError, match=re.escape(f"Checkpoint file not found: {missing}")
        ):
            fit(trainer(tmp_path, *plugins), PlainNet(), train_dataloaders=loader(),
                ckpt_path=missing)  # fmt: skip


def test_directory_checkpoints_of_earlier_versions_load_and_are_replaced(
    fitted: dict[str, Any], tmp_path: Path
) -> None:
    import shardpoint.torch as sptorch

    old = tmp_path / "old.ckpt"  # the layout before: a directory holding checkpoint "state"
    old.mkdir()
    sptorch.save(load_checkpoint(fitted["path"]), old / "state", single_file=False)
    assert_same_tree(params(EvalNet.load_from_checkpoint(old)), fitted["params"])
    plugin = ShardpointCheckpointIO()
    plugin.save_checkpoint(load_checkpoint(old), old)
    assert old.is_file() and not Path(f"{old}.shardpoint-new").exists()
    assert_same_tree(plugin.load_checkpoint(old)["state_dict"], fitted["params"])
    other = tmp_path / "not-a-checkpoint"
    other.mkdir()
    with pytest.raises(IsADirectoryError):
        plugin.save_checkpoint({"w": torch.ones(1)}, other)
    assert other.is_dir()


def test_reader_is_left_out_for_an_untested_lightning_release(monkeypatch: Any) -> None:
    """On a Lightning release the reader was not tested with, Lightning's loader stays as it
    is and a warning names the alternatives (run in this process: the loader is put back as
    Lightning bound it, and the version faked, for this test only)."""
    from lightning.fabric.plugins.io import torch_io
    from lightning.fabric.utilities import cloud_io
    from lightning.pytorch.core import saving

    from shardpoint.integrations import _lightning_reader as reader

    ShardpointCheckpointIO()  # the reader in front, as in any other test
    for mod, attr in ((cloud_io, "_load"), (torch_io, "pl_load"), (saving, "pl_load")):
        monkeypatch.setattr(mod, attr, getattr(mod, attr).__shardpoint_reader__)
    native = cloud_io._load
    monkeypatch.setattr(L, "__version__", "2.5.0")
    monkeypatch.setattr(reader, "_WARNED", set())
    with pytest.warns(UserWarning, match=r"\(2, 5\) is not a release.*load_from_checkpoint"):
        ShardpointCheckpointIO()
    assert cloud_io._load is native and saving.pl_load is native and not reader.installed()
