"""The directory ``shardpoint export`` writes, read by the readers a user tries next.

A user exports a model for serving and then, in another script, points the everyday readers at
the directory: ``sp.open(DIR)``, ``sp.load_file(DIR)``, ``weights_iterator(DIR)``. Before the
thirteenth round of issue 41 only the serving loaders (vLLM, SGLang, ``from_pretrained``)
resolved it; the readers said ``DIR.index: not found``. Each step runs in a fresh process, as the
user's next script would. A directory holding several checkpoints, or none, says so by name."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shardpoint as sp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from integration_helpers.common import tiny_llama  # noqa: E402


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (stderr shown on failure)."""
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    """A tiny Llama saved by ``save_pretrained`` and exported with the CLI (default codec)."""
    root = tmp_path_factory.mktemp("serving_dir")
    tiny_llama(3).save_pretrained(root / "hf")
    out = subprocess.run(
        [sys.executable, "-m", "shardpoint", "export", str(root / "hf"), str(root / "serve")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (root / "serve" / "model.index").is_file()
    assert not list((root / "serve").glob("*.safetensors"))
    return root / "hf", root / "serve"


def _want(hf: pathlib.Path) -> dict[str, str]:
    tensors = safetensors_torch.load_file(str(hf / "model.safetensors"))
    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in tensors.items()}


@pytest.mark.parametrize("slash", ["", "/"])
def test_the_everyday_readers_open_an_exported_directory_in_a_fresh_process(
    exported: tuple[pathlib.Path, pathlib.Path], slash: str
) -> None:
    hf, serve = exported
    got = _run(
        f"""
        import hashlib, json, torch, shardpoint as sp
        from shardpoint.torch import weights_iterator
        d = {str(serve) + slash!r}
        def tag(v):
            return hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()
        with sp.open(d, framework="pt") as r:
            opened = {{k: tag(r[k]) for k in r.keys()}}
        loaded = {{k: tag(torch.from_numpy(v)) for k, v in sp.load_file(d).items()}}
        with weights_iterator(d) as it:
            streamed = {{k: tag(v) for k, v in it}}
        print(json.dumps([opened, loaded, streamed]))
        """
    )
    want = _want(hf)
    opened, loaded, streamed = json.loads(got)
    assert len(want) == 2 + 9 * 2 + 1  # embed, norm, lm_head + 9 per layer
    assert opened == want
    assert loaded == want
    assert streamed == want


def test_the_directory_prefers_the_whole_model_over_its_tensor_parallel_pieces(
    tmp_path: pathlib.Path,
) -> None:
    d = tmp_path / "serve"
    d.mkdir()
    sp.save_file({"w": np.arange(4.0)}, str(d / "model-rank-0-of-2"))
    sp.save_file({"w": np.arange(4.0)}, str(d / "model-rank-1-of-2"))
    sp.save_file({"w": np.arange(8.0)}, str(d / "model"))
    got = _run(f"import shardpoint as sp; print(sp.load_file({str(d)!r})['w'].size)")
    assert got.strip() == "8"


def test_a_directory_of_one_checkpoint_opens_it(tmp_path: pathlib.Path) -> None:
    sp.save_file({"w": np.arange(3.0)}, str(tmp_path / "ckpt-1"), compression="none")
    assert sp.load_file(str(tmp_path))["w"].tolist() == [0.0, 1.0, 2.0]
    assert sp.load_file(f"file://{tmp_path}/")["w"].tolist() == [0.0, 1.0, 2.0]


def test_a_directory_of_several_checkpoints_names_them(tmp_path: pathlib.Path) -> None:
    for n in ("ckpt-1", "ckpt-2"):
        sp.save_file({"w": np.zeros(2)}, str(tmp_path / n))
    with pytest.raises(sp.NotFoundError) as e:
        sp.open(str(tmp_path))
    msg = str(e.value)
    assert msg.startswith(f"no checkpoint at {str(tmp_path)!r}: it is a directory")
    assert "2 checkpoints (ckpt-1, ckpt-2)" in msg
    assert repr(os.path.join(str(tmp_path), "ckpt-1")) in msg


def test_a_directory_of_one_tensorflow_checkpoint_is_not_taken_for_ours(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "model.ckpt.index").write_bytes(b"\x00" * 64)  # TensorFlow's index: not ours
    with pytest.raises(sp.NotFoundError, match="it holds no shardpoint checkpoint"):
        sp.open(str(tmp_path))


def test_an_empty_directory_says_it_holds_no_checkpoint(tmp_path: pathlib.Path) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(sp.NotFoundError, match="it holds no shardpoint checkpoint") as e:
        sp.load_file(str(tmp_path))
    assert isinstance(e.value, FileNotFoundError)
    assert str(tmp_path) in str(e.value)


def _child(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that never imports shardpoint itself (the startup file
    the wheel ships installs the front), offline like a server without the Hub."""
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, env=full,
    )  # fmt: skip


def test_transformers_from_pretrained_reads_the_directory_in_the_next_script(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    hf, serve = exported
    prefix = tmp_path / "ck"
    out = subprocess.run(
        [sys.executable, "-m", "shardpoint", "convert", str(hf), str(prefix)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    p = _child(
        f"""
        import hashlib, json, sys, torch, transformers
        def tags(m):
            return {{k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()
                    for k, v in m.state_dict().items()}}
        ids = torch.tensor([[1, 5, 9, 2]])
        ref = transformers.AutoModelForCausalLM.from_pretrained({str(hf)!r})
        auto = transformers.AutoModelForCausalLM.from_pretrained({str(serve)!r})
        concrete = transformers.LlamaForCausalLM.from_pretrained(
            {str(serve)!r}, dtype=torch.bfloat16, device_map="auto", local_files_only=True
        )
        converted = transformers.AutoModelForCausalLM.from_pretrained({str(prefix)!r})
        with torch.no_grad():
            same = [torch.equal(m(ids).logits, ref.eval()(ids).logits) for m in (auto, converted)]
        print(json.dumps({{
            "loaded": "shardpoint" in sys.modules,
            "types": [type(m).__name__ for m in (auto, concrete, converted)],
            "training": [m.training for m in (auto, concrete, converted)],
            "dtype": str(concrete.dtype),
            "same_logits": same,
            "tags": [tags(m) == tags(ref) for m in (auto, converted)],
            "bf16": all(torch.equal(v, ref.state_dict()[k].to(torch.bfloat16))
                        for k, v in concrete.state_dict().items()),
        }}))
        """
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {
        "loaded": True,  # imported by the front, only once a path was ours
        "types": ["LlamaForCausalLM"] * 3,
        "training": [False] * 3,
        "dtype": "torch.bfloat16",
        "same_logits": [True, True],
        "tags": [True, True],
        "bf16": True,
    }


def test_from_pretrained_leaves_other_paths_to_transformers_and_refuses_what_it_cannot_do(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    hf, serve = exported
    # one next script, in order: the Hugging Face directory (transformers' own loading,
    # shardpoint never imported); a path that is nothing (transformers' own error, unchanged);
    # then what only transformers' own loading does on ours (refused, naming the way out)
    missing = str(tmp_path / "no-such-model")
    p = _child(
        f"""
        import sys, traceback, transformers
        transformers.AutoModelForCausalLM.from_pretrained({str(hf)!r})
        print("shardpoint" in sys.modules)
        try:
            transformers.AutoModel.from_pretrained({missing!r})
            print("LOADED")
        except Exception as e:
            print(traceback.format_exception_only(e)[-1].strip(), flush=True)
        print("shardpoint" in sys.modules, flush=True)
        transformers.AutoModelForCausalLM.from_pretrained({str(serve)!r}, load_in_8bit=True)
        """
    )
    *_, hf_loaded, last, after_missing = p.stdout.strip().splitlines()
    assert hf_loaded == "False", p.stdout + p.stderr
    assert last.startswith("OSError") and "shardpoint" not in last, last
    assert after_missing == "False"  # the missing path went to transformers alone
    assert p.returncode != 0
    assert "does not support load_in_8bit" in p.stderr and "--to hf" in p.stderr
    # turned off: an error naming shardpoint and the call that reads it
    p = _child(
        f"import transformers; transformers.AutoModel.from_pretrained({str(serve)!r})",
        env={"SHARDPOINT_TORCH_LOAD": "0"},
    )
    assert p.returncode != 0
    assert "is a shardpoint checkpoint" in p.stderr
    assert "shardpoint.hf.from_pretrained(AutoModel, path)" in p.stderr


def test_the_front_installed_after_transformers_was_imported_fronts_the_auto_classes(
    exported: tuple[pathlib.Path, pathlib.Path],
) -> None:
    """No startup file (a source tree on PYTHONPATH): ``import shardpoint`` installs the hook
    after transformers defined its auto classes, each with its own copy of the method."""
    _, serve = exported
    p = _child(
        f"""
        import sys, _shardpoint_loaders
        for f in list(sys.meta_path):  # as if the startup file had not run
            if type(f).__name__ == "_AfterImport":
                sys.meta_path.remove(f)
        import transformers
        auto = transformers.AutoModelForCausalLM
        try:
            auto.from_pretrained({str(serve)!r})
        except OSError as e:
            print("before:", "model.safetensors" in str(e))
        import shardpoint
        print("after:", type(auto.from_pretrained({str(serve)!r})).__name__)
        """
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-2:] == ["before: True", "after: LlamaForCausalLM"]


def test_the_way_out_the_errors_name_converts_a_serving_directory_to_hugging_face(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    """``shardpoint convert DIR OUT --to hf`` (what the refusals above suggest) with the config
    and tokenizer files that sit beside the checkpoint in the serving directory, so
    transformers loads OUT by itself."""
    hf, serve = exported
    dst = tmp_path / "out"
    out = subprocess.run(
        [sys.executable, "-m", "shardpoint", "convert", str(serve), str(dst), "--to", "hf"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (dst / "config.json").read_text() == (serve / "config.json").read_text()
    # the library call gives the same directory
    sp.export_hf(str(serve), str(tmp_path / "out2"))
    assert sorted(os.listdir(tmp_path / "out2")) == sorted(os.listdir(dst))
    with_hf = _child(
        f"""
        import hashlib, json, transformers
        m = transformers.AutoModelForCausalLM.from_pretrained({str(dst)!r})
        print(json.dumps({{k: hashlib.sha256(v.numpy().tobytes()).hexdigest()
                          for k, v in m.state_dict().items()}}))
        """
    )
    assert with_hf.returncode == 0, with_hf.stderr
    assert json.loads(with_hf.stdout.strip().splitlines()[-1]) == _want(hf)


def test_a_directory_of_tensor_parallel_pieces_says_what_it_holds(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    hf, _ = exported
    serve = tmp_path / "serve-tp"
    cmd = ["export", str(hf), str(serve), "--tp", "2", "--no-fsync"]
    out = subprocess.run(
        [sys.executable, "-m", "shardpoint", *cmd], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert not (serve / "model.index").exists()
    p = _child(f"import transformers; transformers.AutoModel.from_pretrained({str(serve)!r})")
    assert p.returncode != 0
    assert "holds only tensor-parallel pieces" in p.stderr.strip().splitlines()[-1]
    with pytest.raises(sp.NotFoundError, match="2 checkpoints"):
        sp.open(str(serve))  # the pieces are read through the engines' sharded loaders


def test_a_hugging_face_directory_with_a_checkpoint_beside_its_weights_opens_the_weights(
    exported: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    """A Trainer's ``checkpoint-N`` keeps ``model.safetensors`` and, with the integration, its
    optimizer state in ``shardpoint.index``: the directory's model is the weights."""
    hf, _ = exported
    d = tmp_path / "checkpoint-3"
    d.mkdir()
    for f in hf.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    sp.save_file({"optimizer/step": np.arange(2)}, str(d / "shardpoint"))
    with sp.open(str(d)) as r:
        assert "optimizer/step" not in r.keys()
        assert set(r.keys()) == set(_want(hf))
