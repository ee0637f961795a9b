"""The merge from partial indexes in memory (FORMAT.md §8.4): DCP's coordinator merges the
partials its ranks sent with their write results instead of reading them back; the bytes get a
file's checks, and an error names the rank's partial ``(in memory)``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardpoint as sp

TOKEN = "0123456789abcdef0123456789abcdef"


def _partials(prefix: str, world: int, token: str = TOKEN) -> list[bytes]:
    """``world`` writers' partials at ``prefix`` (rank r holds ``k{r}``), as committed."""
    out = []
    for r in range(world):
        w = sp.Writer(prefix, rank=r, world_size=world, merge_token=token, durable=False)
        w.add(f"k{r}", np.arange(r + 3, dtype=np.int64))
        got = w.commit_partial()
        published = Path(prefix + f".index.part-{r:05d}-of-{world:05d}")
        assert got == published.read_bytes()  # the bytes it published
        out.append(got)
    return out


def test_merge_from_memory_commits_what_a_fresh_process_reads(tmp_path: Path) -> None:
    prefix = str(tmp_path / "ck")
    parts = _partials(prefix, 3)
    sp.merge(prefix, 3, token=TOKEN, partials=parts, durable=False)
    assert not list(tmp_path.glob("ck.index.part-*"))  # the published partials were consumed
    code = (
        "import shardpoint as sp, sys; r = sp.open(sys.argv[1]); print(sorted(r), r['k2'].tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, prefix], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['k0', 'k1', 'k2'] [0, 1, 2, 3, 4]"


def _flip(b: bytes, at: int) -> bytes:
    return b[:at] + bytes([b[at] ^ 0xFF]) + b[at + 1 :]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (lambda b: _flip(b, len(b) // 2), r"index\.part-00001-of-00003 \(in memory\)"),
        (lambda b: b[: len(b) - 7], r"index\.part-00001-of-00003 \(in memory\)"),
        (lambda b: b"", r"index\.part-00001-of-00003 \(in memory\)"),
    ],
    ids=["corrupt", "truncated", "empty"],
)
def test_merge_from_memory_refuses_a_bad_partial_naming_its_rank(
    tmp_path: Path, bad: object, match: str
) -> None:
    prefix = str(tmp_path / "ck")
    sp.save_file({"old": np.zeros(2)}, prefix)
    before = Path(prefix + ".index").read_bytes()
    parts = _partials(prefix, 3)
    parts[1] = bad(parts[1])  # type: ignore[operator]
    with pytest.raises(sp.CheckpointError, match=match):
        sp.merge(prefix, 3, token=TOKEN, partials=parts, durable=False)
    assert Path(prefix + ".index").read_bytes() == before  # nothing was committed


def test_merge_from_memory_refuses_a_foreign_token_and_a_short_list(tmp_path: Path) -> None:
    prefix = str(tmp_path / "ck")
    parts = _partials(prefix, 3)
    foreign = _partials(str(tmp_path / "other"), 3, token="f" * 32)
    with pytest.raises(
        sp.InvalidArgumentError, match=r"part-00002-of-00003 \(in memory\).*rank 2 has merge token"
    ):
        sp.merge(prefix, 3, token=TOKEN, partials=[parts[0], parts[1], foreign[2]])
    with pytest.raises(sp.InvalidArgumentError, match="3 writers was given 2 partial"):
        sp.merge(prefix, 3, token=TOKEN, partials=parts[:2])
    assert not Path(prefix + ".index").exists()
    sp.merge(prefix, 3, token=TOKEN, durable=False)  # the published files still merge
    assert sorted(sp.open(prefix)) == ["k0", "k1", "k2"]
