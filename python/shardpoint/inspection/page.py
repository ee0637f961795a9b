"""``shardpoint view``: one self-contained HTML file to browse a checkpoint.

Why a static file rather than a local server: it works offline and anywhere (attach it to a
bug report, open it from a cluster's shared disk), there is no port, token or process to secure
or to keep alive, and nothing reads the checkpoint after the page is written. The price is that
statistics cannot be computed on demand: they are computed while writing the page (default for
checkpoints under 4 GiB; ``--stats`` / ``--no-stats`` decide) and the rest of the page needs
only the index.

The page (``view.html`` next to this module) is plain HTML + JavaScript with no third-party
code: a virtualised key list (only the rows in view are in the DOM, so 100,000+ keys scroll
smoothly), a squarified treemap of bytes drawn on a canvas by ~50 lines of layout code, and the
per-layer change as CSS bars. No chart library was worth vendoring for two fixed figures.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from typing import Any

from .. import storage
from ..convert import detect_format, open_source, resolve_prefix
from .health import checkpoint_stats
from .valuediff import value_diff

__all__ = ["page_data", "render_page", "write_page"]

#: Below this many raw bytes statistics are computed by default.
AUTO_STATS_LIMIT = 4 << 30


def _entries(path: str) -> tuple[str, list[list[Any]]]:
    """(resolved path, [[key, dtype, shape, raw, stored, codec], ...]) from the index only."""
    fmt, resolved = detect_format(path)
    if fmt in ("shardpoint", "hf", "safetensors"):
        with storage.open(resolved) as r:
            rows = []
            for k in r.keys():
                i = r.info(k)
                dtype = i.dtype if i.kind == "tensor" else i.kind
                rows.append([k, dtype, list(i.shape), i.raw_bytes, i.stored_bytes, i.codec])
            return resolved, rows
    with open_source(resolved) as src:
        return resolved, [
            [s.key, s.dtype if s.kind == "tensor" else s.kind, list(s.shape), s.nbytes, s.nbytes, src.format]
            for s in src.specs()
        ]  # fmt: skip


def page_data(
    path: str, *, other: str | None = None, stats: bool | None = None, progress: bool | None = None
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able dict."""
    resolved, rows = _entries(path if storage.is_url(path) else resolve_prefix(path))
    raw = sum(r[3] for r in rows)
    if stats is None:
        stats = raw < AUTO_STATS_LIMIT
    doc: dict[str, Any] = {
        "title": os.path.basename(resolved.rstrip("/")) or resolved,
        "path": resolved,
        "entries": rows,
        "stats": None,
        "change": None,
        "other": other,
    }
    if stats:
        st = checkpoint_stats(resolved, progress=progress)
        # [min, max, mean, std, l2, nan, inf, zeros] per key
        doc["stats"] = {
            k: [s["min"], s["max"], s["mean"], s["std"], s["l2"], s["nan"], s["posinf"] + s["neginf"], s["zeros"]]
            for k, s in st.items()
        }  # fmt: skip
    if other is not None:
        d = value_diff(resolved, other, progress=progress)
        doc["change"] = {
            "tensors": {
                t.key: [_finite(t.rel_l2), _finite(t.max_abs), t.norm_a, t.norm_diff, t.identical]
                for t in d.tensors
            },
            "only_a": d.only_a,
            "only_b": d.only_b,
            "mismatched": [list(m) for m in d.mismatched],
        }
    return doc


def _finite(x: float) -> float | str:
    return x if x == x and abs(x) != float("inf") else "inf"


def render_page(doc: dict[str, Any]) -> str:
    """The HTML text with ``doc`` embedded (``</`` escaped so keys cannot close the script)."""
    template = resources.files(__package__).joinpath("view.html").read_text(encoding="utf-8")
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    data = re.sub(r"</", r"<\\/", data)
    title = doc["title"].replace("&", "&amp;").replace("<", "&lt;")
    return template.replace("__TITLE__", title).replace("__DATA__", data)


def write_page(
    path: str,
    output: str | None = None,
    *,
    other: str | None = None,
    stats: bool | None = None,
    progress: bool | None = None,
) -> str:
    """Write the page of checkpoint ``path`` (compared with ``other`` when given) to
    ``output`` (default ``./<name>.view.html``); returns the file written."""
    doc = page_data(path, other=other, stats=stats, progress=progress)
    out = output or f"{doc['title']}.view.html"
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(render_page(doc))
    os.replace(tmp, out)
    return out
