"""Every fenced ``python`` and ``bash`` block of README.md and docs/*.md runs, as written.

A document's blocks run top to bottom in one fresh interpreter (python blocks share one
namespace, as a reader follows the page; bash blocks run with ``bash -e``) inside an empty
temporary directory. A block that cannot run says so in the document, with its reason, in one
of two ways:

- an HTML comment on the line before the fence: ``<!-- no-run: needs a GPU -->``;
- its info string: `````python no-run`````.

``shardpoint`` on a bash block's ``PATH`` is this checkout's command line, ``python`` the
interpreter running these tests.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(\s*)```(\S*)(.*)$")
_NO_RUN = re.compile(r"<!--\s*no-run:\s*(\S.*?)\s*-->")
_LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str  # "python" or "bash"
    code: str
    skip: str | None  # the reason, when marked no-run


def blocks_of(path: pathlib.Path) -> list[Block]:
    """The python/bash blocks of one Markdown file, with their no-run marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, rest = m.group(1), m.group(2).lower(), m.group(3)
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        if lang in _LANGS:
            code = textwrap.dedent("\n".join(x[len(indent) :] for x in lines[i + 1 : j]))
            skip = None
            if rest.strip().startswith("no-run"):
                skip = rest.strip()[len("no-run") :].strip(" :") or "marked no-run"
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            if k >= 0 and (found := _NO_RUN.search(lines[k])):
                skip = found.group(1)
            out.append(Block(path.name, i + 1, _LANGS[lang], code + "\n", skip))
        i = j + 1
    return out


# The driver run in a fresh interpreter per document: blocks in order, one namespace.
_DRIVER = r"""
import json, os, subprocess, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for b in blocks:
    where = f"{b['doc']}:{b['line']}"
    if b["lang"] == "python":
        try:
            exec(compile(b["code"], where, "exec"), ns)
        except BaseException:
            traceback.print_exc()
            print(f"\nFAILED block at {where}:\n{b['code']}", file=sys.stderr)
            sys.exit(1)
    else:
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b["code"]])
        if r.returncode:
            print(f"\nFAILED block at {where} (exit {r.returncode}):\n{b['code']}", file=sys.stderr)
            sys.exit(1)
"""


def _runnable(path: pathlib.Path) -> list[Block]:
    return [b for b in blocks_of(path) if b.skip is None]


def test_marks_are_found(tmp_path: pathlib.Path) -> None:
    """The extractor sees marks the way the documents use them (guards the harness itself)."""
    doc = tmp_path / "probe.md"
    doc.write_text(
        "text\n<!-- no-run: needs a bucket -->\n```python\nraise SystemExit(1)\n```\n"
        "```python no-run: a GPU\nraise SystemExit(1)\n```\n"
        "  ```bash\n  echo ok\n  ```\n```json\n{}\n```\n"
    )
    got = blocks_of(doc)
    assert [(b.lang, b.skip) for b in got] == [
        ("python", "needs a bucket"),
        ("python", "a GPU"),
        ("bash", None),
    ]
    assert got[2].code == "echo ok\n"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_doc_blocks_run(doc: pathlib.Path, tmp_path: pathlib.Path) -> None:
    blocks = _runnable(doc)
    if not blocks:
        assert all(b.skip for b in blocks_of(doc))
        return
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([b.__dict__ for b in blocks]))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "shardpoint"  # this checkout's CLI, whatever is installed
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shardpoint "$@"\n')
    shim.chmod(0o755)
    # `python` in a bash block is the interpreter running these tests, whatever PATH holds
    # (a script, not a link: a link outside the virtual environment would not be in it)
    py = bin_dir / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run(
        [sys.executable, str(driver), str(spec)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"{doc.name}:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
