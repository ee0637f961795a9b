"""The compiled fast path for safetensors headers (``rust/src/st_header.rs``) against the
Python checks it stands in for (``hf_format._checked_header``): it may pass a header to the
checks (``None``) but never accept one they refuse, and what it accepts it reads exactly as
they do. Headers are generated valid and then damaged in the ways hostile files are."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardpoint.convert.hf_format import (
    ST_BITS,
    ShardHeader,
    _checked_header,
    read_shard_header,
)
from shardpoint.errors import CorruptCheckpointError
from shardpoint.storage.safetensors_header import parse_safetensors_header

_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
_DIMS = st.lists(st.integers(0, 6), max_size=3)


@st.composite
def _valid(draw: st.DrawFn) -> tuple[list[tuple[str, object]], int]:
    """A header's members (name, record) in file order, and its data area's length."""
    names = draw(st.lists(_NAMES.filter(lambda k: k != "__metadata__"), unique=True, max_size=6))
    records = []
    for name in names:
        tag = draw(st.sampled_from(sorted(ST_BITS)))
        shape = draw(_DIMS)
        n = 0 if 0 in shape else 1
        for d in shape:
            n *= d
        bits = n * ST_BITS[tag]
        if bits % 8:  # sub-byte dtypes: make the element count fill whole bytes
            shape, bits = [8], 8 * ST_BITS[tag]
        records.append([name, tag, shape, bits // 8])
    order = draw(st.permutations(range(len(records))))  # the data's order is not the header's
    pos, offsets = 0, {}
    for i in order:
        offsets[i] = [pos, pos + records[i][3]]
        pos += records[i][3]
    members: list[tuple[str, object]] = [
        (name, {"dtype": tag, "shape": shape, "data_offsets": offsets[i]})
        for i, (name, tag, shape, _) in enumerate(records)
    ]
    meta = draw(st.sampled_from([None, "absent", {}, {"format": "pt"}]))
    if meta != "absent":
        members.insert(draw(st.integers(0, len(members))), ("__metadata__", meta))
    return members, pos


def _text(members: list[tuple[str, object]]) -> str:
    """JSON of an object with these members, in this order, duplicates kept."""
    return "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}"


_BAD_VALUES = st.sampled_from(
    [-1, 2**63, 2**64, 1.5, True, None, "3", [1], {"a": 1}, float("nan"), 2**70]
)


@st.composite
def _damaged(draw: st.DrawFn) -> tuple[bytes, int]:
    members, data_len = draw(_valid())
    tensors = [i for i, (k, _) in enumerate(members) if k != "__metadata__"]
    how = draw(
        st.sampled_from(
            ["none", "field", "drop", "dtype", "dup", "nested_dup", "length", "meta", "text"]
        )
    )
    if how == "field" and tensors:
        i = draw(st.sampled_from(tensors))
        rec = dict(members[i][1])  # type: ignore[call-overload]
        field = draw(st.sampled_from(["shape", "data_offsets"]))
        value = list(rec[field])
        if value and draw(st.booleans()):
            value[draw(st.integers(0, len(value) - 1))] = draw(_BAD_VALUES)
        else:
            value = draw(st.one_of(_BAD_VALUES, st.just(value + [0])))
        rec[field] = value
        members[i] = (members[i][0], rec)
    elif how == "drop" and tensors:
        i = draw(st.sampled_from(tensors))
        rec = dict(members[i][1])  # type: ignore[call-overload]
        del rec[draw(st.sampled_from(sorted(rec)))]
        members[i] = (members[i][0], rec)
    elif how == "dtype" and tensors:
        i = draw(st.sampled_from(tensors))
        rec = dict(members[i][1], dtype=draw(st.sampled_from(["F33", "f32", "", 7])))  # type: ignore[call-overload]
        members[i] = (members[i][0], rec)
    elif how == "dup" and members:
        members.append(draw(st.sampled_from(members)))
    elif how == "nested_dup" and tensors:
        i = draw(st.sampled_from(tensors))
        name, rec = members[i]
        body = _text(list(rec.items()))[:-1] + ',"dtype":"U8"}'  # type: ignore[attr-defined]
        text = _text(members).replace(_text([(name, rec)])[1:-1], f"{json.dumps(name)}:{body}")
        return text.encode(), data_len
    elif how == "length":
        data_len += draw(st.sampled_from([-1, 1, 4096]))
    elif how == "meta":
        members.append(
            ("__metadata__", draw(st.sampled_from([{"k": 1}, [], 0, "", "x", {"k": None}])))
        )
    elif how == "text":
        text = _text(members)
        cut = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from(["", "x", "\x00", "{", "NaN", "\\ud800"]))
        return (text[:cut] + junk + text[cut:]).encode("utf-8", "surrogatepass"), max(data_len, 0)
    return _text(members).encode(), max(data_len, 0)


def _slow(blob: bytes, data_len: int) -> ShardHeader | None:
    try:
        return _checked_header("h.safetensors", blob, 8 + len(blob) + data_len)
    except CorruptCheckpointError:
        return None


def _same(fast: tuple, slow: ShardHeader) -> bool:
    entries, meta = fast
    got = {k: (tag, shape, b, e) for k, tag, shape, b, e in entries}
    want = {k: (r.tag, r.shape, r.begin, r.end) for k, r in slow.tensors.items()}
    return got == want and list(got) == list(want) and meta == slow.metadata


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_valid())
def test_a_valid_header_takes_the_fast_path_and_reads_as_the_checks_do(
    header: tuple[list[tuple[str, object]], int],
) -> None:
    members, data_len = header
    blob = _text(members).encode()
    fast = parse_safetensors_header(blob, data_len)
    slow = _slow(blob, data_len)
    assert slow is not None and fast is not None
    assert _same(fast, slow)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_damaged())
def test_the_fast_path_never_accepts_what_the_checks_refuse(case: tuple[bytes, int]) -> None:
    blob, data_len = case
    if not blob.startswith(b"{"):
        return  # refused before either runs (read_shard_header's first check)
    fast = parse_safetensors_header(blob, data_len)
    slow = _slow(blob, data_len)
    if fast is not None:
        assert slow is not None, blob[:200]
        assert _same(fast, slow)


def test_a_damaged_file_is_still_named_by_the_checks(tmp_path) -> None:
    """A refused header falls through to the checks, whose error names file, key and fault."""
    body = {"a": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 16]}}
    text = json.dumps(body).encode()
    p = tmp_path / "model.safetensors"
    p.write_bytes(len(text).to_bytes(8, "little") + text + bytes(16))
    with pytest.raises(CorruptCheckpointError, match=r"model.safetensors: key 'a'.*needs 32 bytes"):
        read_shard_header(str(p))
