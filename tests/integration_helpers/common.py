"""Shared pieces of the trainer-integration tests: digests, the no-pickle check, the child
runner and the mid-save kill hook."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

#: file suffixes of pickles (torch.save's .pt/.pth/.bin, pickle's .pkl): none may be written
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth")
TESTS = Path(__file__).resolve().parents[1]


def digest(named: Any) -> str:
    """sha256 over ``(name, bytes)`` of a state dict's tensors, in name order."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(named.items()):
        if isinstance(t, torch.Tensor):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def hexes(losses: list[float]) -> list[str]:
    """Losses as exact hex floats (bit-identical comparison through JSON)."""
    return [float(x).hex() for x in losses]


def pickles_under(root: str | os.PathLike[str]) -> list[str]:
    """Every file under ``root`` whose suffix is a pickle's and whose bytes are not a
    shardpoint single file (the Hugging Face integration writes ``optimizer.pt`` in our
    format: by content, not by name)."""
    return sorted(
        str(p)
        for p in Path(root).rglob("*")
        if p.is_file() and p.suffix in PICKLE_SUFFIXES and not _ours(p)
    )


def _ours(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"SPSINGLE"


def run_child(module: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m integration_helpers.<module> args...``; its last stdout line is JSON."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", f"integration_helpers.{module}", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"child {module} {args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child_killed(module: str, *args: str, kill_at_save: int) -> subprocess.CompletedProcess:
    """Run the child with the mid-save kill hook armed: it SIGKILLs itself while writing the
    data of its ``kill_at_save``-th shardpoint save (after data was written, before the
    index commit). Returns the finished process (killed: returncode -9)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    full_env["SP_TEST_KILL_AT_SAVE"] = str(kill_at_save)
    return subprocess.run(
        [sys.executable, "-m", f"integration_helpers.{module}", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


def run_ranks(
    module: str,
    *args: str,
    world: int = 2,
    env: dict[str, str] | None = None,
    kill_rank0_at_save: int = 0,
    timeout: float = 900,
) -> list[Any]:
    """Run ``python -m integration_helpers.<module> args...`` as ``world`` ranks of one job
    (``RANK``/``WORLD_SIZE`` set, gloo, the rendezvous served by this process: rank_rendezvous);
    each rank's last stdout line is JSON.
    With ``kill_rank0_at_save=n`` rank 0 SIGKILLs itself during its n-th save (the mid-save
    kill hook); the other ranks, left waiting in a collective, are then SIGKILLed too, and the
    ranks' return codes are returned instead."""
    from rank_rendezvous import rendezvous_env

    with rendezvous_env() as rendezvous:
        return _run_ranks(module, args, world, env, kill_rank0_at_save, timeout, rendezvous)


def _run_ranks(
    module: str,
    args: tuple[str, ...],
    world: int,
    env: dict[str, str] | None,
    kill_rank0_at_save: int,
    timeout: float,
    rendezvous: dict[str, str],
) -> list[Any]:
    procs = []
    for rank in range(world):
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        full_env.update(env or {})
        full_env.update(rendezvous)
        full_env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
        if kill_rank0_at_save and rank == 0:
            full_env["SP_TEST_KILL_AT_SAVE"] = str(kill_rank0_at_save)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", f"integration_helpers.{module}", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=full_env,
            )
        )
    try:
        if kill_rank0_at_save:
            out, err = procs[0].communicate(timeout=timeout)
            assert procs[0].returncode == -9 and "SELFKILL mid-save" in out, err[-3000:]
            for p in procs[1:]:
                p.kill()
                p.communicate(timeout=60)
            return [p.returncode for p in procs]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise AssertionError(f"rank exited {p.returncode}\n{out[-3000:]}\n{err[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank of a gloo job (its checks all done) without interpreter finalization.

    Why: DDP (Lightning, accelerate, the HF Trainer, a DCP user's model) and DeepSpeed keep
    the gloo group alive past ``destroy_process_group`` (after it and ``gc.collect()`` a
    rank with a DDP model still runs gloo's ``pt_gloo_runloop`` threads), so those threads
    are torn down during interpreter finalization, where under load a rank that had printed
    its results aborted ("terminate called without an active exception", exit -6; the
    teardown race of pytorch/pytorch#179291, CI's failure fixed in test_torch_distributed).
    The exit handlers still run first, with the interpreter whole (shardpoint's wait for
    queued async saves among them); then the group is destroyed and the process leaves."""
    import atexit

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def arm_kill_hook() -> None:
    """In a child: when ``SP_TEST_KILL_AT_SAVE=n``, SIGKILL this process during the n-th
    blocking shardpoint save, at its first progress report from the Rust writer (data being
    written, index not yet committed). Test-only monkeypatching, as in reliability_helpers."""
    at = int(os.environ.get("SP_TEST_KILL_AT_SAVE", "0"))
    if not at:
        return
    from shardpoint.storage import save

    count = {"saves": 0}

    class KillBar:
        def __init__(self, total: float | None, desc: str, **_: Any) -> None:
            count["saves"] += 1
            self.armed = count["saves"] == at

        def update(self, n: float) -> None:
            if self.armed:
                print("SELFKILL mid-save", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        def close(self) -> None:
            pass

    save.wanted = lambda progress: True  # type: ignore[assignment]
    save.progress_bar = KillBar  # type: ignore[assignment]


def damage_safetensors(path: str | os.PathLike[str], key: str) -> None:
    """Flip one byte in the middle of tensor ``key``'s data in a safetensors file."""
    raw = bytearray(Path(path).read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[key]["data_offsets"]
    raw[8 + n + (begin + end) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(raw))


def bits(t: Any) -> bytes:
    """A tensor's bytes (bit-for-bit comparison, NaN payloads and -0.0 included)."""
    import torch

    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same_tree(a: Any, b: Any, path: str = "", roots: tuple[str, str] = ("", "")) -> None:
    """Nested equality of two checkpoint trees, tensors bit for bit; dict keys compare as
    strings; strings compare with their run directories (``roots``) cut out (trainers record
    their checkpoint paths)."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), (path, type(b))
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype)
        assert bits(a) == bits(b), path
    elif type(a).__module__ == "numpy" and hasattr(a, "dtype"):
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype)
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert sorted(map(str, a)) == sorted(map(str, b)), (path, sorted(map(str, a)))
        bb = {str(k): v for k, v in b.items()}
        for k, v in a.items():
            assert_same_tree(v, bb[str(k)], f"{path}/{k}", roots)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, f"{path}/{i}", roots)
    elif isinstance(a, str) and roots[0]:
        assert a.replace(roots[0], "") == b.replace(roots[1], ""), (path, a, b)
    else:
        assert a == b, (path, a, b)


def damage_value(prefix: str, key: str) -> Path:
    """Flip one byte inside the stored bytes of ``key`` in its shard file (or in the single
    file ``prefix``); returns the file."""
    import shardpoint as sp

    with sp.open(prefix) as r:
        info = r.info(key)
    base = 0
    if Path(prefix).is_file() and _ours(Path(prefix)):
        # a single file (FORMAT.md §10): the shard region starts at shard_off
        shard = Path(prefix)
        base = int.from_bytes(shard.read_bytes()[24:32], "little")
    else:
        (shard,) = [
            p
            for p in Path(prefix).parent.glob(Path(prefix).name + ".data-*")
            if p.name.split(".data-")[1].startswith(f"{info.shard:05d}")
        ]
    raw = bytearray(shard.read_bytes())
    raw[base + info.offset + info.stored_bytes // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    return shard


class ParameterCopies:
    """Context manager recording, through a real ``TorchFunctionMode``, every ``copy_`` into
    one of ``params`` (same memory and shape) whose source is other memory: what a restore
    that loads values into fresh tensors and then copies them into the model does, and a
    restore that decodes into the parameters does not (its ``load_state_dict`` copy is then
    a copy of the parameter onto itself)."""

    def __init__(self, params: Any) -> None:
        self.params = {p.data_ptr(): tuple(p.shape) for p in params}
        self.into_params = 0  # copy_ calls writing a parameter at all
        self.from_elsewhere: list[tuple[int, ...]] = []

    def __enter__(self) -> ParameterCopies:
        import torch
        from torch.overrides import TorchFunctionMode

        spy = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if func is torch.Tensor.copy_:
                    dst, src = args[0], args[1]
                    if spy.params.get(dst.data_ptr()) == tuple(dst.shape):
                        spy.into_params += 1
                        if src.data_ptr() != dst.data_ptr():
                            spy.from_elsewhere.append(tuple(dst.shape))
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


def tiny_llama(seed: int, **config: Any) -> Any:
    """A tiny Llama for causal LM built from a config (two layers, grouped-query attention),
    its weights drawn from torch's generator seeded with ``seed``; ``config`` overrides."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        **{
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 48,
            "max_position_embeddings": 64, **config,
        }
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)
