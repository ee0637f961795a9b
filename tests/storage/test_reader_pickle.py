"""A ``Reader`` pickles by reference (its path and the options it was opened with) and is
reopened, its index validated again, where it is unpickled: a torch Dataset holding one works
in a ``DataLoader`` with ``spawn`` and ``forkserver`` workers."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.errors import CorruptCheckpointError, InvalidArgumentError, NotFoundError


def _checkpoint(tmp_path: Path, name: str = "ck", **kw: Any) -> str:
    prefix = str(tmp_path / name)
    rows = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    sp.save_file({"rows": rows, "labels": np.arange(8)}, prefix, durable=False, **kw)
    return prefix


def test_a_reader_pickles_by_path_and_options(tmp_path: Path) -> None:
    prefix = _checkpoint(tmp_path)
    with sp.open(prefix, verify=False, copy=True) as r:
        blob = pickle.dumps(r)
        assert len(blob) < 1024  # a reference, not the data or the index
        with pickle.loads(blob) as again:
            assert again.path == prefix and again.keys() == r.keys()
            assert (again._verify, again._copy) == (False, True)
            assert np.array_equal(again["rows"], r["rows"])


def test_a_single_file_reader_with_a_framework_pickles(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    path = _checkpoint(tmp_path, "model.pt")
    with sp.open(path, framework="pt") as r, pickle.loads(pickle.dumps(r)) as again:
        assert isinstance(again["rows"], torch.Tensor)
        assert torch.equal(again["rows"], r["rows"])


def test_a_closed_reader_unpickles_closed(tmp_path: Path) -> None:
    prefix = _checkpoint(tmp_path)
    r = sp.open(prefix)
    r.close()
    sp.remove(prefix)  # a closed reader's copy touches no file
    again = pickle.loads(pickle.dumps(r))
    assert again.path == prefix
    with pytest.raises(InvalidArgumentError, match="closed"):
        again.keys()


def test_the_copy_validates_the_checkpoint_again(tmp_path: Path) -> None:
    prefix = _checkpoint(tmp_path)
    r = sp.open(prefix)
    blob = pickle.dumps(r)
    with open(prefix + ".index", "r+b") as f:  # damage the index after the pickle
        f.seek(0)
        f.write(b"XXXX")
    with pytest.raises(CorruptCheckpointError):
        pickle.loads(blob)
    os.remove(prefix + ".index")
    with pytest.raises(NotFoundError):
        pickle.loads(blob)


def test_a_remote_reader_pickles_with_its_storage_options() -> None:
    pytest.importorskip("moto.server", reason="needs moto[server] (requirements-dev)")
    from s3_server import moto_environment

    with moto_environment() as m:
        options = {"endpoint": m.endpoint, "allow_http": "true"}
        prefix = f"s3://{m.bucket()}/pickled/ck"
        _remote_round_trip(prefix, options)


def _remote_round_trip(prefix: str, options: dict[str, str]) -> None:
    sp.save_file({"x": np.arange(5)}, prefix, storage_options=options)
    with sp.open(prefix, storage_options=options) as r:
        blob = pickle.dumps(r)
    with pickle.loads(blob) as again:
        assert again._open_args["storage_options"] == options
        assert np.array_equal(again["x"], np.arange(5))


class ReaderDataset:
    """A map-style dataset reading rows lazily from a reader it holds (what users write)."""

    def __init__(self, prefix: str) -> None:
        self.reader = sp.open(prefix)

    def __len__(self) -> int:
        return int(self.reader.info("rows").shape[0])

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.reader.slice("rows", i, i + 1)[0], os.getpid()


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_dataloader_with_spawned_workers_reads_through_the_reader(
    tmp_path: Path, context: str
) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    prefix = _checkpoint(tmp_path)
    loader = DataLoader(
        ReaderDataset(prefix),  # type: ignore[arg-type]  # a map-style dataset by protocol
        batch_size=2,
        num_workers=2,
        multiprocessing_context=context,
    )
    rows, pids = [], set()
    for batch, pid in loader:
        rows.append(batch)
        pids.update(int(p) for p in pid)
    assert torch.equal(torch.cat(rows), torch.arange(24, dtype=torch.float32).reshape(8, 3))
    assert os.getpid() not in pids and len(pids) == 2  # read in the two workers
