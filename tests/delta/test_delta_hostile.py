"""Hostile and wrong inputs to delta reads (docs/DELTA.md, FORMAT.md §11): a changed, missing
or damaged base, forged tables, truncated and forged sync deltas are refused with our errors,
and a refused sync apply leaves the receiver's values as they were."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

import shardpoint as sp
import shardpoint.delta as spd
from shardpoint.delta.table import SECTION


def states() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    a = {"w": rng.standard_normal((256, 128)).astype(np.float32), "v": np.arange(64.0)}
    b = {k: v.copy() for k, v in a.items()}
    b["w"][::3, ::4] += 0.5
    return a, b


def delta_ckpt(tmp_path: os.PathLike[str]) -> tuple[str, str, dict[str, np.ndarray]]:
    a, b = states()
    base, p = os.path.join(tmp_path, "base"), os.path.join(tmp_path, "p")
    sp.save_file(a, base)
    sp.save_file(b, p, base=base, delta=True)
    return base, p, b


def test_changed_base_is_refused_naming_both_digests(tmp_path: os.PathLike[str]) -> None:
    base, p, _ = delta_ckpt(tmp_path)
    recorded = spd.describe(p)["base_digest"]
    a, _ = states()
    a["w"][0, 0] = 3.0
    sp.save_file(a, base)  # another checkpoint under the base's name
    with sp.open(p) as r, pytest.raises(sp.BaseMismatchError) as e:
        r["w"]
    assert recorded in str(e.value) and spd.index_digest(base) in str(e.value)
    assert isinstance(e.value, sp.DigestMismatchError)


def test_missing_base_is_not_found(tmp_path: os.PathLike[str]) -> None:
    base, p, b = delta_ckpt(tmp_path)
    sp.remove(base)
    with sp.open(p) as r:
        with pytest.raises(sp.NotFoundError, match="base checkpoint"):
            r["w"]
        r.keys()  # the index still opens: only values that need the base fail


def test_damaged_base_data_never_yields_a_value(tmp_path: os.PathLike[str]) -> None:
    base, p, _ = delta_ckpt(tmp_path)
    shard = glob.glob(base + ".data-*")[0]
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:  # flip bytes in the middle of the payloads
        for off in range(size // 2, size - 64, 997):
            f.seek(off)
            byte = f.read(1)
            f.seek(off)
            f.write(bytes([byte[0] ^ 0x5A]))
    with sp.open(p) as r, pytest.raises(sp.CorruptCheckpointError):
        r["w"]


def forge(p: str, edit: object) -> None:
    """Rewrite checkpoint ``p`` with the same values and an edited delta table."""
    with sp.open(p) as r:
        plain = r._plain  # the stored entries, payloads under their reserved keys
        values = {k: plain[k] for k in plain.keys()}
        sections = dict(r.sections)
    table = sections[SECTION]
    edit(table)  # type: ignore[operator]
    sp.save_file(values, p, _sections=sections, _internal_keys=True)


@pytest.mark.parametrize(
    "edit, error",
    [
        (lambda t: t["entries"]["w"].__setitem__(1, (t["entries"]["w"][1] + 1) % 2**32),
         sp.ChecksumMismatchError),
        (lambda t: t["entries"]["w"].__setitem__(1, 2**40), sp.CorruptCheckpointError),
        (lambda t: t["entries"]["w"].__setitem__(0, "rle"), sp.CorruptCheckpointError),
        (lambda t: t.__setitem__("depth", 10**9), sp.CorruptCheckpointError),
        (lambda t: t.__setitem__("version", 2), sp.UnsupportedFormatError),
        (lambda t: t["base"].__setitem__("digest", "sha256:00"), sp.CorruptCheckpointError),
    ],
)  # fmt: skip
def test_forged_tables_are_refused(tmp_path: os.PathLike[str], edit: object, error: type) -> None:
    _, p, _ = delta_ckpt(tmp_path)
    forge(p, edit)
    with pytest.raises(error):
        sp.load_file(p)


def test_sync_apply_to_another_state_changes_nothing() -> None:
    a, b = states()
    blob = spd.encode(a, b)
    target = {k: v.copy() for k, v in a.items()}
    target["v"][5] = -1.0
    before = {k: v.copy() for k, v in target.items()}
    with pytest.raises(sp.BaseMismatchError, match="first differing key: 'v'") as e:
        spd.apply(blob, target)
    assert str(e.value).count("state:") == 2
    for k in before:
        assert before[k].tobytes() == target[k].tobytes()


@pytest.mark.parametrize("cut", [0, 1, 100, -1, -100])
def test_truncated_sync_delta_is_refused(cut: int) -> None:
    a, b = states()
    blob = spd.encode(a, b)
    assert blob is not None
    target = {k: v.copy() for k, v in a.items()}
    with pytest.raises(sp.CheckpointError):
        spd.apply(blob[:cut], target)
    assert target["w"].tobytes() == a["w"].tobytes()


def test_forged_result_crc_restores_the_target(tmp_path: os.PathLike[str]) -> None:
    a, b = states()
    f = os.path.join(tmp_path, "d.sp")
    spd.encode(a, b, f)
    with sp.open(f) as r:
        values = {k: r._plain[k] for k in r._plain.keys()}
        sections = json.loads(json.dumps(r.sections))
    sections[SECTION]["entries"]["w"][1] ^= 1
    sp.save_file(values, f, _sections=sections, _internal_keys=True)
    target = {k: v.copy() for k, v in a.items()}
    with pytest.raises(sp.ChecksumMismatchError, match="restored"):
        spd.apply(f, target)
    assert target["w"].tobytes() == a["w"].tobytes()


def test_delta_options_are_checked(tmp_path: os.PathLike[str]) -> None:
    a, _ = states()
    with pytest.raises(sp.InvalidArgumentError, match="base="):
        sp.save_file(a, os.path.join(tmp_path, "x"), delta=True)
    with pytest.raises(sp.BaseMismatchError, match=r"target is float32\[256, 64\]"):
        spd.apply(spd.encode(a, a), {"w": a["w"][:, ::2], "v": a["v"]})
    with pytest.raises(sp.InvalidArgumentError, match="not a weight-sync delta"):
        spd.apply(os.path.join(tmp_path, "x.sp") if sp.save_file(a, os.path.join(tmp_path, "x.sp"))
                  is None else "", {})  # fmt: skip


def test_a_depth_that_is_not_one_more_than_the_bases(tmp_path: os.PathLike[str]) -> None:
    """Each link of a chain is one deeper than its base: a table recording another depth
    (which could hide a chain longer than MAX_DEPTH behind depth 1) is refused when the base
    is opened, naming both depths."""
    a, b = states()
    c0, c1, c2 = (os.path.join(tmp_path, f"c{i}") for i in range(3))
    sp.save_file(a, c0)
    sp.save_file(b, c1, base=c0, delta=True)
    b["v"][0] += 1
    sp.save_file(b, c2, base=c1, delta=True)
    assert np.array_equal(sp.load_file(c2)["v"], b["v"])  # the chain as written reads
    for depth in (1, 3):
        forge(c2, lambda t, d=depth: t.__setitem__("depth", d))
        with sp.open(c2) as r, pytest.raises(sp.CorruptCheckpointError) as e:
            r["w"]
        assert f"{c2}.index: delta table records depth {depth}" in str(e.value)
        assert f"its base {c1!r} has depth 1" in str(e.value)


def _forge_payload(p: str, key: str, payload: np.ndarray) -> None:
    """Rewrite ``p`` with ``payload`` as the stored XOR payload of ``key`` (so the payload's
    dtype and shape are no longer those of the base's value)."""
    from shardpoint.delta.table import payload_key

    with sp.open(p) as r:
        plain = r._plain
        values = {k: plain[k] for k in plain.keys()}
        sections = dict(r.sections)
    values[payload_key(key)] = payload
    sections[SECTION]["entries"][key][0] = "xor"
    sp.save_file(values, p, _sections=sections, _internal_keys=True)


@pytest.mark.parametrize(
    "payload",
    [
        np.zeros((128, 256), np.float32),  # the same bytes, another shape
        np.zeros((256, 256), np.float16),  # the same bytes, another dtype
        np.zeros(64, np.float64),  # fewer rows: slices read the base's rows instead
    ],
)
def test_a_payload_of_another_shape_than_the_bases_value(
    tmp_path: os.PathLike[str], payload: np.ndarray
) -> None:
    """Whole reads rebuilt the base's bytes viewed as the payload's shape (its crc matches);
    slices XORed the base's rows with the payload's (an error naming neither key nor file,
    or, for a shorter payload, the base's own rows returned as this value's). Now every read
    of the key checks the base's dtype and shape first."""
    base, p, _ = delta_ckpt(tmp_path)
    _forge_payload(p, "w", payload)
    want = f"{p}.index: delta key 'w' is {payload.dtype} {payload.shape}, its base {base!r}"
    reads = [
        lambda r: r["w"],
        lambda r: r.load(["w"]),
        lambda r: r.slice("w", 0, 3),
        lambda r: r.get_slice("w")[1:3],
    ]
    for read in reads:
        with sp.open(p) as r, pytest.raises(sp.CorruptCheckpointError) as e:
            read(r)
        assert want in str(e.value) and "holds it as float32 (256, 128)" in str(e.value)


def test_a_delta_key_missing_from_its_base(tmp_path: os.PathLike[str]) -> None:
    base, p, _ = delta_ckpt(tmp_path)
    _forge_payload(p, "w", np.zeros((256, 128), np.float32))
    with sp.open(p) as r:
        plain = r._plain
        values = {k: plain[k] for k in plain.keys()}
        sections = dict(r.sections)
    table = sections[SECTION]
    table["entries"]["x"] = table["entries"].pop("w")
    from shardpoint.delta.table import payload_key

    values[payload_key("x")] = values.pop(payload_key("w"))
    sp.save_file(values, p, _sections=sections, _internal_keys=True)
    with sp.open(p) as r, pytest.raises(sp.CorruptCheckpointError) as e:
        r["x"]
    assert f"{p}.index: delta key 'x' is not in its base {base!r}" in str(e.value)
