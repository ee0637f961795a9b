"""`shardpoint diff --values` on two saves of a real torch model around one optimizer step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.cli import main
from shardpoint.inspection import value_diff

torch = pytest.importorskip("torch")


def _model_and_step(tmp_path):
    from shardpoint import torch as sptorch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4, bias=False)
    )
    model.register_buffer("frozen", torch.arange(5, dtype=torch.float32))
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    a = str(tmp_path / "step0")
    sptorch.save(before, a)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    opt.step()
    after = {k: v.detach().clone() for k, v in model.state_dict().items()}
    b = str(tmp_path / "step1")
    sptorch.save(after, b)
    return a, b, before, after


def test_value_diff_after_one_step(tmp_path) -> None:
    a, b, before, after = _model_and_step(tmp_path)
    res = value_diff(a, b)
    assert not res.identical and not res.only_a and not res.only_b
    by_key = {t.key: t for t in res.tensors}
    assert set(by_key) == set(before)
    # the buffer did not move: equal crc32c settles it without reading
    assert by_key["frozen"].identical and by_key["frozen"].decided_by == "crc"
    for k in ("0.weight", "0.bias", "2.weight"):
        t = by_key[k]
        x, y = before[k].double().numpy(), after[k].double().numpy()
        ref = np.linalg.norm(x - y) / np.linalg.norm(x)
        assert not t.identical and t.decided_by == "values"
        assert math.isclose(t.rel_l2, ref, rel_tol=1e-9)
        assert t.max_abs == pytest.approx(float(np.abs(x - y).max()), rel=1e-12)
        assert t.changed == int((x != y).sum()) and t.count == x.size
    rels = [t.rel_l2 for t in res.tensors]
    assert rels == sorted(rels, reverse=True)


def test_diff_values_cli_across_formats(tmp_path, capsys) -> None:
    from safetensors.numpy import save_file

    a, b, before, after = _model_and_step(tmp_path)
    st = str(tmp_path / "step1.safetensors")
    extra = {k: v.numpy() for k, v in after.items() if k != "0.bias"}
    extra["0.weight"] = extra["0.weight"].astype(np.float16)  # a dtype change
    extra["new"] = np.zeros(2, np.float32)
    save_file(extra, st)
    code = main(["diff", a, st, "--values", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and not doc["identical"]
    assert doc["only_a"] == ["0.bias"] and doc["only_b"] == ["new"]
    assert doc["mismatched"] == [
        {"key": "0.weight", "what": "dtype", "a": "float32", "b": "float16"}
    ]
    t = {x["key"]: x for x in doc["tensors"]}
    assert t["frozen"]["identical"] and t["frozen"]["decided_by"] == "values"  # no crc there
    assert not t["2.weight"]["identical"] and t["2.weight"]["rel_l2"] > 0
    # the same checkpoint against itself: identical, every tensor by crc, exit 0
    code = main(["diff", a, a, "--values"])
    out = capsys.readouterr().out
    assert code == 0 and "0 changed" in out and f"({len(before)} by equal crc32c" in out


def test_value_diff_nan_appearing_is_infinite_change(tmp_path) -> None:
    x = np.linspace(1, 2, 100, dtype=np.float32)
    y = x.copy()
    y[7] = np.nan
    sp.save_file({"w": x}, str(tmp_path / "a"))
    sp.save_file({"w": y}, str(tmp_path / "b"))
    (t,) = value_diff(str(tmp_path / "a"), str(tmp_path / "b")).tensors
    assert not t.identical and math.isinf(t.rel_l2) and math.isinf(t.max_abs) and t.changed == 1
