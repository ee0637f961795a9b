"""What ``torch.load`` returns for a checkpoint shardpoint wrote (the front installed by
``_shardpoint_loaders``: at interpreter start through ``shardpoint_loaders.pth``, and by
``import shardpoint``).

A user's next script reads a trainer's checkpoint the way it always has — ``torch.load(path)``,
``MyModel.load_from_checkpoint(path)``, ``Trainer.fit(ckpt_path=path)`` without the plugin,
``Fabric.load``, DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint`` — and gets what
``torch.load`` of the native file would give: the nested dict as saved, tensors placed by
``map_location``. Nothing is unpickled on this route, whatever ``weights_only`` says (so the
result is the same for ``True`` and ``False``); user types are built from the allow-list
(``shardpoint.add_safe_types``, and torch's own ``add_safe_globals``).

Which reader, by content and the ``shardpoint.integration`` metadata the writer recorded:
a single file or prefix → :func:`shardpoint.torch.load`; a directory holding ``state.index``
written by the DeepSpeed engine → its tree with DeepSpeed's objects rebuilt
(``_deepspeed_objects``); any other such directory (Lightning's form of earlier versions) →
its tree.
"""

from __future__ import annotations

import os
from typing import Any

from .. import storage
from ._state import WRITER_KEY, load_tree, part_prefix

__all__ = ["torch_load"]

_PART = "state"


def _writer(prefix: str) -> str | None:
    with storage.open(prefix) as r:
        who = r.metadata.get(WRITER_KEY)
    return who if isinstance(who, str) else None


def torch_load(f: Any, map_location: Any = None, *, mmap: bool | None = None) -> Any:
    """``torch.load(f, map_location)`` for a checkpoint shardpoint wrote (a path, a directory
    of the integrations' form, or a seekable binary file object)."""
    from ..torch import load as sp_load

    if isinstance(f, str | os.PathLike) and os.path.isdir(os.fspath(f)):
        prefix = part_prefix(f, _PART)
        who = _writer(prefix)
        tree = load_tree(prefix, integration=who or "torch.load", device=map_location)
        if who == "deepspeed":
            from ._deepspeed_objects import decode_objects

            return decode_objects(tree)
        return tree
    return sp_load(f, map_location, mmap=mmap)
