"""A reader that does not know delta tables never sees a wrong value (FORMAT.md §11): delta
payloads sit under reserved keys, so the plain storage reader (the delta layer bypassed, as a
shardpoint before delta checkpoints reads) finds nothing under a delta-coded user key, and
user keys under the reserved prefix are refused by every writer."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.delta.table import PAYLOAD_PREFIX, SECTION, payload_key
from shardpoint.storage.reader import Reader
from shardpoint.storage.values import RESERVED_KEY_PREFIX


def states() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    a = {
        "layer/0/w": rng.standard_normal((128, 64)).astype(np.float32),  # xor
        "layer/1/w": rng.standard_normal((64, 64)).astype(np.float32),  # same
        "layer/2/w": rng.standard_normal((32, 32)).astype(np.float32),  # full (dense change)
        "z": np.arange(10, dtype=np.int64),  # same
    }
    b = {k: v.copy() for k, v in a.items()}
    b["layer/0/w"][::7, ::5] += 1.0
    b["layer/2/w"] = rng.standard_normal((32, 32)).astype(np.float32)
    b["new"] = np.ones(5, np.uint8)  # not in the base: whole
    return a, b


def test_plain_reader_finds_no_value_under_delta_keys(tmp_path: os.PathLike[str]) -> None:
    a, b = states()
    base, p = os.path.join(tmp_path, "base"), os.path.join(tmp_path, "p")
    sp.save_file(a, base)
    sp.save_file(b, p, base=base, delta=True)
    with sp.open(p) as r:
        modes = {k: r.delta_mode(k) for k in r.keys()}
    assert modes == {"layer/0/w": "xor", "layer/1/w": "same", "layer/2/w": "full",
                     "new": "full", "z": "same"}  # fmt: skip
    old = Reader(p)  # the storage reader alone: no delta resolution
    try:
        for key, mode in modes.items():
            if mode == "full":
                assert old[key].tobytes() == b[key].tobytes()
                continue
            assert key not in old and old.get(key) is None
            with pytest.raises(KeyError):
                old[key]
            with pytest.raises(KeyError):
                old.info(key)
            with pytest.raises(KeyError):
                old.load([key])
        # whatever the plain reader lists under a user's key is that key's true value
        for key in old.keys():
            if not key.startswith(RESERVED_KEY_PREFIX):
                assert old[key].tobytes() == b[key].tobytes()
        assert sorted(k for k in old.keys() if k.startswith(PAYLOAD_PREFIX)) == [
            payload_key("layer/0/w"), payload_key("layer/1/w"), payload_key("z")
        ]  # fmt: skip
    finally:
        old.close()


def test_plain_reader_of_a_sync_delta_finds_no_payload_as_value() -> None:
    a, b = states()
    blob = spd.encode(a, b)
    assert blob is not None

    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "d.sp")
        with open(f, "wb") as fh:
            fh.write(blob)
        old = Reader(f)
        try:
            assert "layer/0/w" not in old and "layer/1/w" not in old
            assert old["new"].tobytes() == b["new"].tobytes()
        finally:
            old.close()


def test_delta_reader_shows_user_keys_only(tmp_path: os.PathLike[str]) -> None:
    a, b = states()
    base, p = os.path.join(tmp_path, "base"), os.path.join(tmp_path, "p")
    sp.save_file(a, base)
    sp.save_file(b, p, base=base, delta=True)
    with sp.open(p) as r:
        assert r.keys() == sorted(b, key=lambda k: k.encode())
        assert len(r) == len(b) and list(r) == r.keys()
        assert r.prefix("layer/") == ["layer/0/w", "layer/1/w", "layer/2/w"]
        assert r.prefix("") == r.keys()
        assert all(k in r for k in b)
        assert payload_key("z") not in r
        with pytest.raises(KeyError):
            r[payload_key("z")]
        with pytest.raises(KeyError):
            r.info(payload_key("layer/0/w"))
        for k, v in b.items():
            info = r.info(k)
            assert (info.key, info.dtype, info.shape) == (k, r.info(k).dtype, v.shape)
        out = {k: np.empty_like(v) for k, v in b.items()}
        r.load_into(out)
        for k, v in b.items():
            assert out[k].tobytes() == v.tobytes()
        assert r.get_slice("layer/0/w")[3:9, 2].tobytes() == b["layer/0/w"][3:9, 2].tobytes()
        assert r.slice("z", 2, 5).tobytes() == b["z"][2:5].tobytes()
    got = sp.load_file(p)
    assert sorted(got) == sorted(b)


def test_reserved_user_keys_are_refused(tmp_path: os.PathLike[str]) -> None:
    bad = {RESERVED_KEY_PREFIX + "x": np.zeros(2)}
    with pytest.raises(sp.InvalidKeyError, match="reserved"):
        sp.save_file(bad, os.path.join(tmp_path, "a"))
    with pytest.raises(sp.InvalidKeyError, match="reserved"):
        with sp.Writer(os.path.join(tmp_path, "b")) as w:
            w.add(payload_key("x"), np.zeros(2))
    assert not os.path.exists(os.path.join(tmp_path, "a.index"))


def test_stray_reserved_key_is_refused(tmp_path: os.PathLike[str]) -> None:
    """A payload whose key is missing from the table (or the reverse) is a forged checkpoint."""
    a, b = states()
    base, p = os.path.join(tmp_path, "base"), os.path.join(tmp_path, "p")
    sp.save_file(a, base)
    sp.save_file(b, p, base=base, delta=True)
    with sp.open(p) as r:
        stored = {k: r._plain[k] for k in r._plain.keys()}
        sections = dict(r.sections)
    del sections[SECTION]["entries"]["z"]
    sp.save_file(stored, p, _sections=sections, _internal_keys=True)
    with pytest.raises(sp.CorruptCheckpointError, match="not in the delta table"):
        sp.open(p)
