"""Issue 12 item 7: nothing read from a checkpoint is unpickled without ``allow_pickle=True``.

Two crafted DCP checkpoints whose pickles would create a marker file when unpickled: one with a
``.dcp_metadata.pickle`` entry, one whose non-tensor item holds such a pickle. ``dcp.load``
through ``StorageReader`` must refuse both with ``PickleRefusedError`` naming ``allow_pickle``
and never run the payload; ordinary non-tensor items (ints) still load.
"""

from __future__ import annotations

import io
import os
import pickle
import traceback

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import shardpoint as sp  # noqa: E402
import shardpoint.torch as spt  # noqa: E402
from shardpoint.torch.dcp import METADATA_ENTRY, PICKLED_METADATA_ENTRY  # noqa: E402


class _Payload:
    """Unpickling this creates ``path`` (stands for any command an attacker would run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _refused(load) -> None:
    """``load`` fails with the refusal naming the opt-in (dcp.load wraps it in its
    CheckpointException, whose text carries the original traceback)."""
    with pytest.raises(BaseException) as e:
        load()
    text = "".join(traceback.format_exception(e.value))
    assert "allow_pickle=True" in text, text[-2000:]


def _rewrite(prefix: str, key: str, value: bytes) -> None:
    """Replace one entry of a checkpoint, keeping the others and the metadata."""
    with sp.open(prefix) as r:
        vals, meta = r.load(), r.metadata
    vals = {k: (bytes(v) if isinstance(v, bytes | bytearray) else v) for k, v in vals.items()}
    vals[key] = value
    sp.remove(prefix)
    sp.save_file(vals, prefix, metadata=meta)


def test_pickled_dcp_metadata_is_refused_by_default(tmp_path):
    p = str(tmp_path / "ck")
    marker = str(tmp_path / "pwned")
    dcp.save({"w": torch.ones(3)}, storage_writer=spt.StorageWriter(p))
    with sp.open(p) as r:
        vals, meta = r.load(), r.metadata
    del vals[METADATA_ENTRY]
    vals[PICKLED_METADATA_ENTRY] = pickle.dumps(_Payload(marker))
    sp.remove(p)
    sp.save_file(vals, p, metadata=meta)
    with pytest.raises(sp.PickleRefusedError, match="allow_pickle=True"):
        spt.StorageReader(p).read_metadata()
    # dcp.load wraps the reader's error in its CheckpointException
    _refused(lambda: dcp.load({"w": torch.zeros(3)}, storage_reader=spt.StorageReader(p)))
    assert not os.path.exists(marker)


def test_non_tensor_item_pickle_is_checked_with_the_restricted_unpickler(tmp_path):
    p = str(tmp_path / "ck")
    marker = str(tmp_path / "pwned")
    dcp.save({"w": torch.ones(3), "n": 5}, storage_writer=spt.StorageWriter(p))
    target = {"w": torch.zeros(3), "n": 0}
    dcp.load(target, storage_reader=spt.StorageReader(p))  # an int passes weights_only
    assert target["n"] == 5 and torch.equal(target["w"], torch.ones(3))
    with sp.open(p) as r:
        [key] = [k for k in r.keys() if k != METADATA_ENTRY and r.info(k).kind == "bytes"]
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)  # DCP stores non-tensor items in torch.save's format
    _rewrite(p, key, buf.getvalue())
    _refused(lambda: dcp.load({"w": torch.zeros(3), "n": 0}, storage_reader=spt.StorageReader(p)))
    assert not os.path.exists(marker)
    # the explicit opt-in runs what the file says (that is what opting in means)
    dcp.load({"w": torch.zeros(3), "n": 0}, storage_reader=spt.StorageReader(p, allow_pickle=True))
    assert os.path.exists(marker)
