"""DeepSpeed's ZeRO consolidation on checkpoints written through shardpoint.

DeepSpeed turns a ZeRO-2/3 checkpoint (every rank's partition of the fp32 master weights) into
one state dict with ``deepspeed.utils.zero_to_fp32`` — the ``zero_to_fp32.py`` script it copies
into each checkpoint directory, or ``get_fp32_state_dict_from_zero_checkpoint`` — reading each
``*_states.pt`` file with ``torch.load``. With ``use_shardpoint(engine)`` those names are
directories holding shardpoint checkpoints, so this module runs **DeepSpeed's own
consolidation** with its reads served by shardpoint: inside :func:`reading_shardpoint`, the
``torch`` name of ``deepspeed.utils.zero_to_fp32`` resolves to ``torch`` except for ``load``,
which reads a shardpoint directory (its allow-listed objects rebuilt, nothing unpickled) and
hands any other path to the real ``torch.load``. The merging logic stays DeepSpeed's, so
every ZeRO layout it understands is understood here.

Command line (DeepSpeed's script's arguments; ``use_shardpoint`` also puts a two-line
``zero_to_fp32.py``/``zero_to_torch.py`` calling it in each checkpoint directory, where
DeepSpeed puts its own)::

    python -m shardpoint.integrations.zero_to_fp32 CHECKPOINT_DIR OUTPUT_DIR [--safe_serialization]
        [--max_shard_size 5GB] [-t TAG] [--dtype float32|float16|bfloat16] [--exclude_frozen_parameters]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ._deepspeed_objects import decode_objects
from ._state import has_part, load_tree, part_prefix

__all__ = [
    "reading_shardpoint",
    "get_fp32_state_dict_from_zero_checkpoint",
    "convert_zero_checkpoint_to_state_dict",
    "load_state_dict_from_zero_checkpoint",
    "write_recovery_scripts",
    "main",
]

_PART = "state"  # the part name of every file the checkpoint engine writes
_LOCK = threading.RLock()

#: the scripts DeepSpeed copies into a checkpoint directory, replaced by callers of ours
RECOVERY_SCRIPT = '''#!/usr/bin/env python
"""DeepSpeed's {name} for this checkpoint: its *_states.pt entries are directories holding
shardpoint checkpoints, so DeepSpeed's consolidation runs with its reads served by shardpoint
(same arguments; needs shardpoint installed: pip install 'shardpoint[deepspeed]')."""
import sys

from shardpoint.integrations.zero_to_fp32 import main

sys.exit(main())
'''


class _Torch:
    """``torch`` with ``load`` reading shardpoint directories (every other name is torch's)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def load(self, f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike) and has_part(f, _PART):
            return decode_objects(load_tree(part_prefix(f, _PART), integration="deepspeed"))
        return self._real.load(f, map_location, *args, **kwargs)


@contextlib.contextmanager
def reading_shardpoint() -> Iterator[Any]:
    """Inside: ``deepspeed.utils.zero_to_fp32`` reads shardpoint directories (and any native
    file) as ``torch.load`` would. Yields that module."""
    from deepspeed.utils import zero_to_fp32 as ds

    with _LOCK:
        real = ds.torch
        ds.torch = _Torch(real)
        try:
            yield ds
        finally:
            ds.torch = real


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
    lazy_mode: bool = False,
) -> dict[str, Any]:
    """DeepSpeed's function of that name (the consolidated fp32 state dict of a ZeRO-2/3
    checkpoint; ``tag`` defaults to the one in ``latest``), on a shardpoint checkpoint."""
    with reading_shardpoint() as ds:
        out: dict[str, Any] = ds.get_fp32_state_dict_from_zero_checkpoint(
            os.fspath(checkpoint_dir),
            tag=tag,
            exclude_frozen_parameters=exclude_frozen_parameters,
            lazy_mode=lazy_mode,
        )
    return out


def convert_zero_checkpoint_to_state_dict(
    checkpoint_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str], **kwargs: Any
) -> None:
    """DeepSpeed's ``convert_zero_checkpoint_to_state_dict`` (``dtype``, ``max_shard_size``,
    ``safe_serialization``, ``tag``, ``exclude_frozen_parameters``) on a shardpoint checkpoint.
    With ``safe_serialization=True`` the output is safetensors; otherwise DeepSpeed writes
    ``pytorch_model.bin`` files with ``torch.save`` (pickles), as its script does."""
    with reading_shardpoint() as ds:
        ds.convert_zero_checkpoint_to_state_dict(
            os.fspath(checkpoint_dir), os.fspath(output_dir), **kwargs
        )


def load_state_dict_from_zero_checkpoint(
    model: Any, checkpoint_dir: str | os.PathLike[str], tag: str | None = None
) -> Any:
    """DeepSpeed's ``load_state_dict_from_zero_checkpoint`` (the model, moved to the CPU,
    holding the consolidated fp32 weights) on a shardpoint checkpoint."""
    with reading_shardpoint() as ds:
        return ds.load_state_dict_from_zero_checkpoint(model, os.fspath(checkpoint_dir), tag)


def write_recovery_scripts(save_path: str) -> None:
    """Put ``zero_to_fp32.py`` and ``zero_to_torch.py`` calling :func:`main` in ``save_path``
    (where DeepSpeed puts its own, which cannot read these files)."""
    for name in ("zero_to_fp32.py", "zero_to_torch.py"):
        path = os.path.join(save_path, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(RECOVERY_SCRIPT.format(name=name))
        os.chmod(path, 0o755)


def main(argv: list[str] | None = None) -> int:
    """The command line of DeepSpeed's ``zero_to_fp32.py``/``zero_to_torch.py``."""
    p = argparse.ArgumentParser(
        prog="python -m shardpoint.integrations.zero_to_fp32",
        description="Consolidate a DeepSpeed ZeRO-2/3 checkpoint written through shardpoint "
        "into one state dict (DeepSpeed's zero_to_fp32, reading shardpoint's files).",
    )
    p.add_argument("checkpoint_dir", help="the folder holding the tag folders, e.g. ckpts/")
    p.add_argument("output_dir", help="where the consolidated state dict files go")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--max_shard_size", default="5GB")
    p.add_argument("--safe_serialization", action="store_true", help="write safetensors")
    p.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: `latest`)")
    p.add_argument("--exclude_frozen_parameters", action="store_true")
    p.add_argument("-d", "--debug", action="store_true")
    args = p.parse_args(argv)
    with reading_shardpoint() as ds:
        ds.debug = args.debug
        ds.convert_zero_checkpoint_to_state_dict(
            args.checkpoint_dir,
            args.output_dir,
            dtype=args.dtype,
            max_shard_size=args.max_shard_size,
            safe_serialization=args.safe_serialization,
            tag=args.tag,
            exclude_frozen_parameters=args.exclude_frozen_parameters,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
