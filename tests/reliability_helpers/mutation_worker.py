"""Worker process of the mutation campaign (``test_reliability_mutations.py``).

Reads jobs from stdin, one JSON object per line: ``{"prefix": damaged checkpoint, "pristine":
the same checkpoint undamaged, "apis": [names]}``. For each API it reads the damaged checkpoint
and the pristine one the same way and writes one JSON line ``{"api", "outcome", "detail"}``:

- ``equal``: the read returned exactly what the pristine checkpoint gives (the damage was in
  bytes this API does not use);
- ``error``: it raised a ``shardpoint.CheckpointError`` (damage detected);
- ``wrong``: it returned something else (silently wrong data: the campaign fails);
- ``unexpected``: it raised an exception outside shardpoint's error tree (a bug).

Then ``{"done": true}``. The process limits its own address space (``RLIMIT_AS``: its size
after the imports plus ``--headroom`` MiB) so an unbounded allocation kills it (the parent sees
the death and counts a signal) instead of the machine; the parent also times every job out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shardpoint as sp
from shardpoint.storage.dtypes import numpy_dtype

#: the 2-D tensor every campaign checkpoint holds (sliced by ``slice`` and ``get_slice``)
MATRIX = "m"


def _tensors(r: sp.Reader) -> list[str]:
    return [k for k in r.keys() if r.info(k).kind == "tensor"]


def _load_into(p: str) -> Any:
    with sp.open(p) as r:
        out = {}
        for k in _tensors(r):
            info = r.info(k)
            out[k] = np.zeros(info.shape, dtype=numpy_dtype(info.dtype))
        r.load_into(out)
        return out


def _each(p: str, how: Callable[[sp.Reader, str], Any], **kw: Any) -> Any:
    with sp.open(p, **kw) as r:
        return {k: how(r, k) for k in r.keys()}


def _verify(p: str) -> None:
    with sp.open(p) as r:
        r.verify()


APIS: dict[str, Callable[[str], Any]] = {
    "r[k]": lambda p: _each(p, lambda r, k: r[k]),
    "get": lambda p: _each(p, lambda r, k: r.get(k)),
    "open(copy)[k]": lambda p: _each(p, lambda r, k: r[k], copy=True),
    "info": lambda p: _each(p, lambda r, k: dataclasses.astuple(r.info(k))),
    "load": lambda p: sp.open(p).load(),
    "load(keys)": lambda p: sp.open(p).load([MATRIX]),
    "load_into": _load_into,
    "slice": lambda p: sp.open(p).slice(MATRIX, 3, 9),
    "get_slice": lambda p: sp.open(p).get_slice(MATRIX)[2:7, 1:5],
    "metadata": lambda p: sp.open(p).metadata,
    "verify": _verify,
    "load_file": lambda p: sp.load_file(p),
    "load_file(copy)": lambda p: sp.load_file(p, copy=True),
}
#: what a crash and a hang look like, for the test of the campaign's own detection
SELF_TESTS: dict[str, Callable[[str], Any]] = {
    "_abort": lambda p: os.abort(),
    "_hang": lambda p: time.sleep(3600),
    "_allocate_past_limit": lambda p: np.ones(1 << 40, dtype=np.uint8),
}


def same(a: Any, b: Any) -> bool:
    """Exact equality of what two reads returned (arrays: dtype, shape and bytes)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--headroom", type=int, default=1024, help="MiB of address space")
    args = ap.parse_args()
    with open("/proc/self/status") as f:
        vm = next(int(x.split()[1]) for x in f if x.startswith("VmSize:")) * 1024
    limit = vm + (args.headroom << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    expected: dict[tuple[str, str], Any] = {}
    out = sys.stdout
    out.write(json.dumps({"ready": True, "as_limit": limit}) + "\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        for api in job["apis"]:
            key = (job["pristine"], api)
            fn = APIS.get(api) or SELF_TESTS[api]
            if key not in expected:
                expected[key] = None if api in SELF_TESTS else fn(job["pristine"])
            try:
                got = fn(job["prefix"])
                outcome = "equal" if same(got, expected[key]) else "wrong"
                detail = "" if outcome == "equal" else f"returned {got!r:.300}"
            except sp.CheckpointError as e:
                outcome, detail = "error", f"{type(e).__name__}: {e}"[:300]
            except Exception as e:  # noqa: BLE001 - anything else is what the campaign hunts
                outcome, detail = "unexpected", f"{type(e).__name__}: {e}"[:300]
            out.write(json.dumps({"api": api, "outcome": outcome, "detail": detail}) + "\n")
            out.flush()
        out.write(json.dumps({"done": True}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
