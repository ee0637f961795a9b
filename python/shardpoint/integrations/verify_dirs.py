"""``shardpoint verify`` of a trainer's checkpoint directory (``checkpoint-500/``,
``checkpoints/checkpoint_3/``, a DeepSpeed ``global_step10/``).

Such a directory holds one or more shardpoint parts written by an integration (their index
metadata names it) and, for the Hugging Face Trainer and accelerate, the model's weights files,
whose tensors' crc32c the part records. Verifying it checks every part (each chunk's crc32c,
the index, the shard headers) and every recorded weight tensor (present, dtype, shape,
crc32c), so one command covers the whole checkpoint.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import storage
from ..storage import is_single_file
from ._state import WRITER_KEY
from ._weights_io import MANIFEST_KEY, verify_weights

__all__ = ["PartReport", "trainer_parts", "verify_checkpoint_dir"]

_INDEX = ".index"


@dataclass
class PartReport:
    """What verifying one part checked."""

    prefix: str
    integration: str
    entries: int
    weights: int


#: the part names the integrations write (their indexes are checked even when unreadable)
_PART_NAMES = re.compile(r"^(shardpoint|state|rng_\d+)$")


def _integration(prefix: str, single: bool = False) -> str | None:
    try:
        with storage.open(prefix) as r:
            who = r.metadata.get(WRITER_KEY)
    except Exception:
        # an integration's part that does not open is damage that verify must report; any
        # other unreadable index is not a trainer's and is left to the generic path. A single
        # file with our magic beside an integration's part (the Hugging Face Trainer's
        # optimizer.pt...) is damage too.
        return "?" if single or _PART_NAMES.match(os.path.basename(prefix)) else None
    return who if isinstance(who, str) else None


def trainer_parts(directory: str) -> list[str]:
    """Prefixes of the shardpoint parts an integration wrote in ``directory`` or in its
    direct sub-directories (DeepSpeed writes one directory per file), sorted."""
    if not os.path.isdir(directory):
        return []
    found = []
    places = [directory] + [
        os.path.join(directory, d)
        for d in sorted(os.listdir(directory))
        if os.path.isdir(os.path.join(directory, d))
    ]
    for place in places:
        singles = []
        for name in sorted(os.listdir(place)):
            path = os.path.join(place, name)
            if name.endswith(_INDEX) and os.path.isfile(path):
                prefix = path[: -len(_INDEX)]
                if _integration(prefix) is not None:
                    found.append(prefix)
            elif is_single_file(path):
                singles.append(path)
        if singles and any(os.path.dirname(p) == place for p in found):
            # the training state a trainer saved in single files beside its part
            found.extend(p for p in singles if _integration(p, single=True) is not None)
    return sorted(found)


def verify_checkpoint_dir(directory: str, *, strong: bool = False) -> list[PartReport] | None:
    """Verify every part of a trainer checkpoint directory and the weights files they record;
    ``None`` when ``directory`` holds no part written by an integration. Damage raises the
    storage layer's errors (``ChecksumMismatchError``, ``CorruptCheckpointError``...)."""
    parts = trainer_parts(directory)
    if not parts:
        return None
    reports = []
    for prefix in parts:
        with storage.open(prefix) as r:
            r.verify(strong=strong)
            meta = r.metadata
            n = len(r)
        manifest = meta.get(MANIFEST_KEY)
        weights = 0
        if manifest is not None:
            from ._weights_io import read_manifest

            rec = read_manifest(prefix, str(meta.get(WRITER_KEY)))
            assert rec is not None
            weights = verify_weights(os.path.dirname(prefix), rec)
        reports.append(PartReport(prefix, str(meta.get(WRITER_KEY)), n, weights))
    return reports
