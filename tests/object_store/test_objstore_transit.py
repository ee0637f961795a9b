"""Bytes damaged in transit never reach the caller: a proxy in front of the moto S3 server flips
one bit of the body of one ranged GET, and every remote read API either raises
``ChecksumMismatchError`` or returns exactly the saved values.

Each API is first run clean (through the proxy, counting its ranged GETs); then once per ranged
GET it makes and per bit position tried, with that one GET damaged. A flip that lands in the
payload of a value (or in a shard header, for ``verify``) must raise; a flip in the alignment
padding between payloads (a coalesced GET carries it) may go unnoticed, but the values
returned must still be exact. The policy is "raise, never retry": the error names the object
and offset, and a caller may retry the read (docs/OBJECT_STORE.md).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shardpoint as sp
from s3_server import Proxy, opts_for
from shardpoint.errors import ChecksumMismatchError, CorruptCheckpointError

_HAVE_TORCH = importlib.util.find_spec("torch") is not None
_TORCH_REQUIRED = os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") == "1"

#: bit positions tried per damaged GET (taken modulo the body's bits by the proxy)
_BITS = (0, 40_961, 7_340_033)

Result = dict[str, np.ndarray]


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(23)
    return {
        # rounded values: the float codec really compresses them (several chunks of 4 KiB)
        "w": np.round(rng.standard_normal((48, 40)), 1).astype(np.float32),
        "b": rng.standard_normal(40).astype(np.float32),
        "i": np.arange(600, dtype=np.int64).reshape(20, 30),
    }


def _apis(torch_ok: bool) -> dict[str, Callable[[str, dict[str, str]], Result]]:
    """name -> fn(url, storage options) returning what it read, for comparison."""

    def getitem(url: str, o: dict[str, str]) -> Result:
        with sp.open(url, storage_options=o) as r:
            return {"w": r["w"], "i": r["i"]}

    def get(url: str, o: dict[str, str]) -> Result:
        with sp.open(url, storage_options=o) as r:
            return {"b": r.get("b")}

    def load(url: str, o: dict[str, str]) -> Result:
        with sp.open(url, storage_options=o) as r:
            return r.load()

    def load_into(url: str, o: dict[str, str]) -> Result:
        ref = _values()
        out = {k: np.zeros_like(v) for k, v in ref.items()}
        with sp.open(url, storage_options=o) as r:
            r.load_into(out)
        return out

    def slice_(url: str, o: dict[str, str]) -> Result:
        with sp.open(url, storage_options=o) as r:
            return {"w[5:17]": r.slice("w", 5, 17), "i[3:4]": r.slice("i", 3, 4)}

    def get_slice(url: str, o: dict[str, str]) -> Result:
        with sp.open(url, storage_options=o) as r:
            return {"w[5:17, 3:9]": r.get_slice("w")[5:17, 3:9], "i[::-2]": r.get_slice("i")[::-2]}

    def verify(url: str, o: dict[str, str]) -> Result:
        with sp.open(url, storage_options=o) as r:
            r.verify()
        return {}

    def load_file(url: str, o: dict[str, str]) -> Result:
        return sp.load_file(url, storage_options=o)

    apis = {
        "r[k]": getitem,
        "get": get,
        "load": load,
        "load_into": load_into,
        "slice": slice_,
        "get_slice": get_slice,
        "verify": verify,
        "load_file": load_file,
    }
    if not torch_ok:
        return apis
    import torch

    import shardpoint.torch as spt

    def torch_load_into(url: str, o: dict[str, str]) -> Result:
        ref = _values()
        target = {k: torch.zeros(v.shape, dtype=torch.from_numpy(v).dtype) for k, v in ref.items()}
        spt.load_into(target, url, storage_options=o)
        return {k: t.numpy() for k, t in target.items()}

    apis["sptorch.load_into"] = torch_load_into
    apis["dcp StorageReader"] = _dcp_read
    return apis


def _dcp_read(url: str, o: dict[str, str]) -> Result:
    """A DCP load plan with one partial read (rows 5:17 of ``w``, as a resharded load asks
    for) and one whole read (``b``), executed by ``StorageReader.read_data``."""
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    import shardpoint.torch as spt

    reader = spt.StorageReader(url + ".dcp", storage_options=o)
    meta = reader.read_metadata()
    reader.set_up_storage_reader(meta, True)
    boxes = {"w": ((5, 0), (12, 40)), "b": ((0,), (40,))}
    items = []
    for fqn, (offsets, lengths) in boxes.items():
        index = next(i for i in meta.storage_data if i.fqn == fqn)
        items.append(
            ReadItem(
                type=LoadItemType.TENSOR,
                dest_index=MetadataIndex(fqn, torch.Size(offsets)),
                dest_offsets=torch.Size(offsets),
                storage_index=index,
                storage_offsets=torch.Size(offsets),
                lengths=torch.Size(lengths),
            )
        )
    got: dict[str, Any] = {}

    class Planner:  # the two calls read_data makes of a LoadPlanner for tensor items
        def resolve_tensor(self, req: ReadItem) -> torch.Tensor:
            return torch.zeros(tuple(req.lengths), dtype=torch.float32)

        def commit_tensor(self, req: ReadItem, tensor: torch.Tensor) -> None:
            got[req.dest_index.fqn] = tensor.numpy().copy()

    reader.read_data(LoadPlan(items), Planner()).wait()  # type: ignore[arg-type]
    return {"w[5:17]": got["w"], "b": got["b"]}


def _expected(name: str) -> Result:
    v = _values()
    return {
        "r[k]": {"w": v["w"], "i": v["i"]},
        "get": {"b": v["b"]},
        "load": v,
        "load_into": v,
        "slice": {"w[5:17]": v["w"][5:17], "i[3:4]": v["i"][3:4]},
        "get_slice": {"w[5:17, 3:9]": v["w"][5:17, 3:9], "i[::-2]": v["i"][::-2]},
        "verify": {},
        "load_file": v,
        "sptorch.load_into": v,
        "dcp StorageReader": {"w[5:17]": v["w"][5:17], "b": v["b"]},
    }[name]


def _payloads(
    url: str, opts: dict[str, str], torch_ok: bool
) -> tuple[dict[str, list[tuple[int, int]]], dict[str, list[tuple[int, int]]]]:
    """(checked byte ranges, shard header ranges) by object path as the proxy sees it
    (bucket/key): checked are the shard headers and every entry's payload."""
    out: dict[str, list[tuple[int, int]]] = {}
    heads: dict[str, list[tuple[int, int]]] = {}
    for prefix in (url, url + ".dcp") if torch_ok else (url,):
        with sp.open(prefix, storage_options=opts) as r:
            shards = [p for p, _ in r._core.shard_files()]
            for p in shards:
                out.setdefault(p.split("://", 1)[1], []).append((0, 64))
                heads.setdefault(p.split("://", 1)[1], []).append((0, 64))
            for k in r.keys():
                info = r.info(k)
                out[shards[info.shard].split("://", 1)[1]].append(
                    (info.offset, info.offset + info.stored_bytes)
                )
    return out, heads


def _checked_byte(
    payloads: dict[str, list[tuple[int, int]]], flipped: tuple[str, str, int]
) -> bool:
    """Whether the flipped byte lies in a checked range (header or payload)."""
    path, rng, rel = flipped
    lo = int(rng.split("=", 1)[1].split("-", 1)[0])
    obj = path.lstrip("/").split("?", 1)[0]
    pos = lo + rel
    return any(a <= pos < b for a, b in payloads.get(obj, []))


def _read_twice(gets: list[tuple[str, str]], flipped: tuple[str, str, int]) -> bool:
    """Whether the flipped byte was fetched by more than one ranged GET of the same call."""
    path, rng, rel = flipped
    pos = int(rng.split("=", 1)[1].split("-", 1)[0]) + rel
    covering = 0
    for p, r in gets:
        lo, hi = (int(x) for x in r.split("=", 1)[1].split("-", 1))
        covering += p.split("?", 1)[0] == path.split("?", 1)[0] and lo <= pos <= hi
    return covering > 1


def _equal(got: Result, want: Result) -> bool:
    return got.keys() == want.keys() and all(
        np.asarray(got[k]).dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want
    )


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_transit_bit_flips_never_return_wrong_values(moto, bucket: str, proxy: Proxy, codec):
    torch_ok = _HAVE_TORCH or _TORCH_REQUIRED  # required in CI: import errors then fail
    url = f"s3://{bucket}/transit/{codec}"
    values = _values()
    sp.save_file(values, url, compression=codec, chunk_bytes=4096)
    if torch_ok:
        import torch
        import torch.distributed.checkpoint as dcp

        import shardpoint.torch as spt

        state = {k: torch.from_numpy(v.copy()) for k, v in values.items() if k != "i"}
        dcp.save(state, storage_writer=spt.StorageWriter(url + ".dcp", compression=codec))
    opts = opts_for(proxy)
    payloads, headers = _payloads(url, opts, torch_ok)
    tally = {"trials": 0, "raised": 0, "harmless": 0}
    for name, api in _apis(torch_ok).items():
        want = _expected(name)
        proxy.flip_ranged_get(None)
        before = len(proxy.requests("GET"))
        assert _equal(api(url, opts), want), f"{name}: wrong values without any damage"
        n_gets = proxy.ranged_gets
        clean_gets = [(p, r) for _, p, r in proxy.requests("GET")[before:] if r]
        assert n_gets >= 1, f"{name} made no ranged GET"
        for nth in range(n_gets):
            for bit in _BITS:
                proxy.flip_ranged_get(nth, bit)
                tally["trials"] += 1
                try:
                    got = api(url, opts)
                except CorruptCheckpointError as e:
                    flipped = list(proxy.flipped)
                    # a payload's damage is a checksum mismatch; damage that verify finds in
                    # a shard header (magic, version) or in padding (not zero) is structural
                    in_payload = _checked_byte(payloads, flipped[0]) and not _checked_byte(
                        headers, flipped[0]
                    )
                    assert isinstance(e, ChecksumMismatchError) or not in_payload, (name, e)
                    tally["raised"] += 1
                    continue
                finally:
                    flipped = list(proxy.flipped)
                    proxy.flip_ranged_get(None)
                assert len(flipped) == 1, f"{name}: GET {nth} was not damaged ({flipped})"
                assert _equal(got, want), f"{name}: WRONG VALUES after transit damage {flipped}"
                # (verify's GETs of the padding are coalesced across the payloads between,
                # whose bytes there it ignores: it checks them in their own GETs)
                # (load_into reads a small raw value by itself and also inside a GET coalesced
                # across its neighbours: a flip there lands in bytes it does not use)
                assert (
                    name == "verify"
                    or not _checked_byte(payloads, flipped[0])
                    or _read_twice(clean_gets, flipped[0])
                ), f"{name}: a damaged payload byte went unnoticed ({flipped[0]})"
                tally["harmless"] += 1
    print(f"transit flips ({codec}): {tally}")
    assert tally["raised"] > tally["harmless"]
