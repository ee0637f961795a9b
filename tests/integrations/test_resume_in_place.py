"""Issue 25: every trainer integration resumes by decoding the checkpoint straight into the
tensors it restores (the model's parameters and buffers, optimizer state that exists), not by
loading fresh tensors and copying them over: after the framework's own resume call the
parameters are the same tensors as before, hold the saved bytes, and no parameter was copied
from other memory (observed with a real ``TorchFunctionMode``). Where the framework may
change or skip values before they land (a Lightning ``on_load_checkpoint`` hook, a module
customising ``load_state_dict``), the values come back fresh and the framework decides, as
before. Real accelerate, transformers, Lightning and DeepSpeed on the CPU, tiny models."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from integration_helpers.common import ParameterCopies, bits, run_child  # noqa: E402


def _bytes(state: Any) -> dict[str, bytes]:
    return {k: bits(v) for k, v in state.items()}


def _ptrs(state: Any) -> dict[str, int]:
    return {k: v.data_ptr() for k, v in state.items()}


def test_accelerate_load_state_fills_parameters_and_optimizer_state_in_place(tmp_path: Path):
    pytest.importorskip("accelerate")
    from shardpoint.integrations.accelerate import ShardpointAccelerator

    acc = ShardpointAccelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)

    def step() -> None:
        acc.backward(model(torch.randn(4, 16)).pow(2).mean())
        opt.step()
        opt.zero_grad()

    step()
    acc.save_state(str(tmp_path / "ck"))
    saved, saved_opt = _bytes(model.state_dict()), opt.state_dict()["state"]
    saved_opt = {(p, k): bits(v) for p, s in saved_opt.items() for k, v in s.items()}
    step()
    step()  # parameters and optimizer state move on
    ptrs = _ptrs(model.state_dict())
    opt_ptrs = {
        (p, k): v.data_ptr() for p, s in opt.state_dict()["state"].items() for k, v in s.items()
    }
    with ParameterCopies(model.parameters()) as copies:
        acc.load_state(str(tmp_path / "ck"))
    assert _ptrs(model.state_dict()) == ptrs and _bytes(model.state_dict()) == saved
    state = opt.state_dict()["state"]
    assert {(p, k): v.data_ptr() for p, s in state.items() for k, v in s.items()} == opt_ptrs
    assert {(p, k): bits(v) for p, s in state.items() for k, v in s.items()} == saved_opt
    assert copies.into_params == 4 and copies.from_elsewhere == []


def test_accelerate_falls_back_where_decoding_in_place_is_not_load_plus_copy(tmp_path: Path):
    """bfloat16 model, float32 checkpoint: cast by load_state_dict as before; a count
    mismatch is refused before any parameter is written."""
    pytest.importorskip("accelerate")
    from shardpoint.errors import CheckpointError
    from shardpoint.integrations.accelerate import ShardpointAccelerator

    acc = ShardpointAccelerator(cpu=True)
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(8, 8))
    acc.save_state(str(tmp_path / "ck"))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.to(torch.bfloat16)
    acc.load_state(str(tmp_path / "ck"))
    for k, v in model.state_dict().items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, want[k].to(torch.bfloat16)), k
    two = ShardpointAccelerator(cpu=True)
    a, b = two.prepare(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    before = _bytes(a.state_dict())
    with pytest.raises(CheckpointError, match="holds 1 models but this Accelerator has 2"):
        two.load_state(str(tmp_path / "ck"))
    assert _bytes(a.state_dict()) == before


def test_hf_trainer_resume_fills_the_models_parameters_in_place(tmp_path: Path):
    pytest.importorskip("transformers")
    warnings.filterwarnings("ignore")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardpoint.integrations import hf_trainer
    from shardpoint.integrations.hf_trainer import ShardpointTrainer

    def model() -> Any:
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
        return GPT2LMHeadModel(cfg)  # tied lm_head / wte

    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": r, "labels": r} for r in ids]

    def trainer(m: Any) -> Any:
        args = TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=2,
            save_steps=2,
            per_device_train_batch_size=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        return ShardpointTrainer(model=m, args=args, train_dataset=data)

    trainer(model()).train()
    ckpt = str(tmp_path / "checkpoint-2")
    weights = hf_trainer.load_checkpoint(ckpt)["model"]  # model.safetensors, tensors checked
    saved = _bytes({**weights, "lm_head.weight": weights["transformer.wte.weight"]})  # tied
    fresh = model()
    ptrs = _ptrs(fresh.state_dict())
    with ParameterCopies(fresh.parameters()) as copies:
        trainer(fresh).train(resume_from_checkpoint=ckpt)  # restores; max_steps already done
    assert _ptrs(fresh.state_dict()) == ptrs and _bytes(fresh.state_dict()) == saved
    assert copies.into_params > 0 and copies.from_elsewhere == []


def _lightning_parts() -> tuple[Any, Any, Any]:
    pl = pytest.importorskip("lightning.pytorch")

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
            )

        def training_step(self, batch: Any, idx: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 8, generator=torch.Generator())),
        batch_size=2,
    )

    def trainer(io: Any) -> Any:
        return pl.Trainer(
            max_steps=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[io],
        )

    return Net, data, trainer


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "AsyncCheckpointIO"])
def test_lightning_fit_from_a_checkpoint_fills_the_parameters_in_place(
    tmp_path: Path, wrapped: bool
):
    Net, data, trainer = _lightning_parts()
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from shardpoint.integrations.lightning import ShardpointCheckpointIO

    def io() -> Any:
        return AsyncCheckpointIO(ShardpointCheckpointIO()) if wrapped else ShardpointCheckpointIO()

    first = trainer(io())
    model = Net()
    first.fit(model, data)
    path = str(tmp_path / "a.ckpt")
    first.save_checkpoint(path)
    first.strategy.checkpoint_io.teardown()
    saved = _bytes(model.state_dict())
    fresh = Net()
    ptrs = _ptrs(fresh.state_dict())
    with ParameterCopies(fresh.parameters()) as copies:
        trainer(io()).fit(fresh, data, ckpt_path=path)  # restores; max_steps already done
    assert _ptrs(fresh.state_dict()) == ptrs and _bytes(fresh.state_dict()) == saved
    assert copies.into_params == 4 and copies.from_elsewhere == []


def test_lightning_on_load_checkpoint_still_decides_what_is_loaded(tmp_path: Path):
    """A module whose hook drops a key (strict_loading=False) keeps that parameter's current
    value: its checkpoint is loaded into fresh tensors, as before."""
    Net, data, trainer = _lightning_parts()
    from shardpoint.integrations.lightning import ShardpointCheckpointIO

    class Keep(Net):  # type: ignore[misc, valid-type]
        strict_loading = False

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            del checkpoint["state_dict"]["net.2.bias"]

    first = trainer(ShardpointCheckpointIO())
    model = Net()
    first.fit(model, data)
    path = str(tmp_path / "a.ckpt")
    first.save_checkpoint(path)
    fresh = Keep()
    with torch.no_grad():
        fresh.net[2].bias.fill_(7.0)
    trainer(ShardpointCheckpointIO()).fit(fresh, data, ckpt_path=path)
    assert torch.equal(fresh.net[2].bias, torch.full((1,), 7.0))
    assert bits(fresh.net[0].weight) == bits(model.net[0].weight)


def test_deepspeed_load_checkpoint_fills_parameters_and_fp32_partitions_in_place(
    tmp_path: Path,
):
    pytest.importorskip("deepspeed")
    env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    zero1, zero2 = run_child(
        "ds_run",
        "inplace", "shardpoint", str(tmp_path / "z1"), "1", ";",
        "inplace", "shardpoint", str(tmp_path / "z2"), "2",
        env=env,
    )  # fmt: skip
    for got in (zero1, zero2):
        assert got == {
            "same_tensors": True,
            "same_bytes": True,
            "same_partitions": True,
            "partitions_saved_bytes": True,
            "copies_into_params": 4,
            "from_elsewhere": 0,
        }
