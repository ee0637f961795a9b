"""The ``shardpoint`` command line (also ``python -m shardpoint``).

Every command opens checkpoints lazily and streams values, so listing or verifying a 100 GB
checkpoint costs its index (or its checksums), not its size in memory. Expected failures (missing
file, damaged file, bad arguments) print one ``shardpoint: error: ...`` line and exit with the
status documented in ``EPILOG``; only a bug in shardpoint itself prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import storage
from ..errors import (
    CheckpointError,
    CheckpointIOError,
    CorruptCheckpointError,
    InvalidArgumentError,
    InvalidKeyError,
    MissingKeyError,
    NotFoundError,
    UnsupportedDTypeError,
)

__all__ = ["main", "EXIT_OK", "EXIT_DAMAGED", "EXIT_USAGE", "EXIT_NOT_FOUND", "EXIT_IO"]

EXIT_OK = 0
EXIT_DAMAGED = 1  # verify found damage, a file is corrupt, or diff found differences
EXIT_USAGE = 2  # bad arguments or unsupported input (argparse uses 2 as well)
EXIT_NOT_FOUND = 3  # a checkpoint or file does not exist
EXIT_IO = 4  # the operating system refused a read or write
EXIT_NONFINITE = (
    2  # stats: a tensor holds NaN/Inf (same number as usage errors; see docs/INSPECT.md)
)
EXIT_INTERNAL = 70  # a bug in shardpoint (EX_SOFTWARE); prints a traceback

EPILOG = """\
exit status:
  0  success (verify: intact; diff: identical; stats: every value finite)
  1  damaged or corrupt checkpoint; diff: the checkpoints differ
  2  usage error: bad arguments, unsupported format or dtype, destination exists;
     stats: a tensor holds NaN/Inf (unless --no-fail)
  3  not found: the checkpoint, file or directory does not exist
  4  I/O error: the operating system refused a read or write
  70 internal error (a bug in shardpoint: please report it with the traceback)

Progress bars are drawn on stderr when it is a terminal (needs tqdm); see --progress.

Object stores: every PREFIX may be a URL (s3://bucket/run/ckpt-7, gs://, az://; s3://bucket/dir/
with a trailing slash is a manager directory). Credentials and endpoint come from the usual
environment (AWS_*, AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, AZURE_*).
"""


class _Fail(Exception):
    """A command's own failure: message and exit status (e.g. diff found differences)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# --- formatting ------------------------------------------------------------------------------
def human(n: int) -> str:
    """Bytes in binary units: 0 B, 1023 B, 1.5 KiB, 12.0 MiB."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{int(v)} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


#: Widest a column is padded to: a longer cell (a long key) overflows its own line only,
#: instead of padding every line of the table to its width.
_MAX_COLUMN = 120
#: Characters of a key shown in the ``ls`` table (``--json`` lists keys whole).
_MAX_KEY_SHOWN = 1000


def _table(rows: list[list[str]], right: set[int]) -> str:
    widths = [min(max(len(r[i]) for r in rows), _MAX_COLUMN) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _emit(text: str) -> None:
    sys.stdout.write(text + "\n")


def _note(text: str) -> None:
    sys.stderr.write(f"shardpoint: note: {text}\n")


def _shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# --- ls --------------------------------------------------------------------------------------
def _entry_rows(r: storage.Reader, keys: list[str]) -> list[dict[str, Any]]:
    rows = []
    for k in keys:
        i = r.info(k)
        rows.append(
            {
                "key": k,
                "dtype": i.dtype if i.kind == "tensor" else i.kind,
                "shape": list(i.shape) if i.kind == "tensor" else None,
                "stored_bytes": i.stored_bytes,
                "raw_bytes": i.raw_bytes,
                "codec": i.codec,
                "ratio": round(i.ratio, 4),
            }
        )
    return rows


def _print_entries(rows: list[dict[str, Any]], as_json: bool, what: str) -> None:
    stored = sum(r["stored_bytes"] or 0 for r in rows)
    raw = sum(r["raw_bytes"] for r in rows)
    totals = {"keys": len(rows), "stored_bytes": stored, "raw_bytes": raw}
    totals["ratio"] = round(raw / stored, 4) if stored else 1.0
    if as_json:
        _emit(json.dumps({"checkpoint": what, "entries": rows, "totals": totals}, indent=1))
        return
    if rows:
        table = [["KEY", "DTYPE", "SHAPE", "STORED", "RAW", "CODEC", "RATIO"]]
        for r in rows:
            shape = _shape(r["shape"]) if r["shape"] is not None else "-"
            st = human(r["stored_bytes"]) if r["stored_bytes"] is not None else "-"
            key = r["key"]
            if len(key) > _MAX_KEY_SHOWN:  # a table line per 64 KiB key helps no reader
                key = f"{key[:_MAX_KEY_SHOWN]}... ({len(key)} characters; --json shows all)"
            table.append(
                [
                    key,
                    r["dtype"],
                    shape,
                    st,
                    human(r["raw_bytes"]),
                    r["codec"],
                    f"{r['ratio']:.2f}",
                ]
            )
        _emit(_table(table, right={3, 4, 6}))
    _emit(
        f"{len(rows)} keys, stored {human(stored)}, raw {human(raw)}, ratio {totals['ratio']:.2f}"
    )


def _foreign_rows(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    from ..convert import open_source

    with open_source(path) as src:
        rows = [
            {
                "key": s.key,
                "dtype": s.dtype if s.kind == "tensor" else s.kind,
                "shape": list(s.shape) if s.kind == "tensor" else None,
                "stored_bytes": None,
                "raw_bytes": s.nbytes,
                "codec": src.format,
                "ratio": 1.0,
            }
            for s in src.specs()
        ]
        return rows, src.notes


def _foreign_checkpoint(prefix: str) -> dict[str, Any] | None:
    """Key count and tensor bytes of a non-shardpoint checkpoint (TensorFlow) in a directory."""
    from ..convert import open_source

    try:
        with open_source(prefix) as src:
            specs = src.specs()
            return {"keys": len(specs), "bytes": sum(x.nbytes for x in specs), "status": src.format}
    except CheckpointError:
        return None


def _list_directory(directory: str, as_json: bool) -> None:
    from ..objgraph.checkpoint_state import read_checkpoint_state, resolve

    state = read_checkpoint_state(directory)
    if state is not None:
        names = state.all_model_checkpoint_paths or [state.model_checkpoint_path]
        stamps = dict(zip(names, state.all_model_checkpoint_timestamps, strict=False))
        latest, source = state.model_checkpoint_path, "state file"
    else:
        listed = storage.list_url(directory) if storage.is_url(directory) else os.listdir(directory)
        found = sorted(f[: -len(".index")] for f in listed if f.endswith(".index"))
        if not storage.is_url(directory):  # and single-file checkpoints, by their magic
            found += sorted(f for f in listed if storage.is_single_file(os.path.join(directory, f)))
        names, stamps, latest, source = found, {}, None, "*.index files"
    out = []
    for name in names:
        prefix = resolve(directory, name)
        row: dict[str, Any] = {"checkpoint": name, "prefix": prefix, "latest": name == latest}
        row["timestamp"] = stamps.get(name)
        try:
            with storage.open(prefix) as r:
                row["keys"] = len(r)
                row["bytes"] = r.format_info["index_bytes"] + sum(
                    n for _, n in r.format_info["shards"]
                )
                row["status"] = "ok"
        except CorruptCheckpointError as e:
            row.update(
                _foreign_checkpoint(prefix)
                or {"keys": None, "bytes": None, "status": f"unreadable: {e}"}
            )
        except CheckpointError as e:
            row.update(keys=None, bytes=None, status=f"unreadable: {e}")
        out.append(row)
    if as_json:
        _emit(json.dumps({"directory": directory, "source": source, "checkpoints": out}, indent=1))
        return
    if not out:
        _emit(f"{directory}: no checkpoints (no state file, no *.index files)")
        return
    table = [["CHECKPOINT", "KEYS", "SIZE", "STATUS"]]
    for row in out:
        name = row["checkpoint"] + ("  (latest)" if row["latest"] else "")
        keys = "-" if row["keys"] is None else str(row["keys"])
        size = "-" if row["bytes"] is None else human(row["bytes"])
        table.append([name, keys, size, row["status"]])
    _emit(_table(table, right={1, 2}))
    _emit(f"{len(out)} checkpoints (from the {source})")


def cmd_ls(args: argparse.Namespace) -> int:
    from ..convert import is_manager_url
    from ..convert.hf import is_hf_path

    url = storage.is_url(args.path)
    if url and (args.path.endswith("/") or is_manager_url(args.path)):
        _list_directory(args.path.rstrip("/"), args.json)
        return EXIT_OK
    if os.path.isdir(args.path) and not is_hf_path(args.path):
        _list_directory(args.path, args.json)
        return EXIT_OK
    from ..convert import detect_format

    fmt, path = detect_format(args.path)
    if fmt == "shardpoint":
        with storage.open(path) as r:
            keys = r.prefix(args.prefix) if args.prefix else r.keys()
            rows = _entry_rows(r, keys)
    else:
        rows, notes = _foreign_rows(path)
        # one order everywhere: sorted keys, as shardpoint checkpoints list them
        rows = sorted(
            (r for r in rows if r["key"].startswith(args.prefix or "")),
            key=lambda r: r["key"].encode("utf-8", "surrogatepass"),
        )
        for n in notes:
            _note(n)
    _print_entries(rows, args.json, path)
    return EXIT_OK


# --- info ------------------------------------------------------------------------------------
def _graph_summary(r: storage.Reader) -> dict[str, Any] | None:
    from ..objgraph.naming import OBJECT_GRAPH_KEY, parse_object_graph

    if OBJECT_GRAPH_KEY not in r:
        return None
    try:
        doc = parse_object_graph(r[OBJECT_GRAPH_KEY])
    except CorruptCheckpointError as e:
        return {"error": str(e)}
    nodes = doc["nodes"]
    children = [c["name"] for c in nodes[0].get("children", [])]
    values = sum(len(n.get("attributes", [])) for n in nodes)
    return {"nodes": len(nodes), "root_children": children, "saved_values": values}


def cmd_info(args: argparse.Namespace) -> int:
    from ..convert import detect_format, resolve_prefix

    fmt, path = detect_format(resolve_prefix(args.path))
    if fmt == "hf":
        return _info_hf(path, args.json)
    if fmt != "shardpoint":
        raise InvalidArgumentError(f"{path}: is a {fmt} file; info reads shardpoint checkpoints")
    with storage.open(path) as r:
        fi = r.format_info
        rows = _entry_rows(r, r.keys())
        doc = {
            "checkpoint": path,
            "format_version": fi.get("format"),
            "writer": fi.get("writer"),
            "entries": len(rows),
            "tensors": sum(1 for x in rows if x["shape"] is not None),
            "raw_bytes": sum(x["raw_bytes"] for x in rows),
            "stored_bytes": sum(x["stored_bytes"] for x in rows),
            "index_bytes": fi["index_bytes"],
            "chunk_bytes": fi["chunk_bytes"],
            "shards": [{"file": f, "bytes": n} for f, n in fi["shards"]],
            "metadata": r.metadata,
            "object_graph": _graph_summary(r),
        }
    if args.json:
        _emit(json.dumps(doc, indent=1, default=str))
        return EXIT_OK
    ratio = doc["raw_bytes"] / doc["stored_bytes"] if doc["stored_bytes"] else 1.0
    _emit(f"checkpoint:     {path}")
    _emit(f"format version: {doc['format_version']} (written by {doc['writer']})")
    _emit(
        f"entries:        {doc['entries']} ({doc['tensors']} tensors, "
        f"{doc['entries'] - doc['tensors']} other values)"
    )
    _emit(
        f"size:           stored {human(doc['stored_bytes'])}, raw {human(doc['raw_bytes'])}, "
        f"ratio {ratio:.2f}; index {human(doc['index_bytes'])}, chunks of {human(doc['chunk_bytes'])}"
    )
    _emit(f"shards:         {len(doc['shards'])}")
    for s in doc["shards"]:
        _emit(f"  {s['file']}  {human(s['bytes'])} ({s['bytes']} bytes)")
    meta = json.dumps(doc["metadata"], sort_keys=True) if doc["metadata"] else "(none)"
    _emit(f"metadata:       {meta}")
    g = doc["object_graph"]
    if g is None:
        _emit("object graph:   (none)")
    elif "error" in g:
        _emit(f"object graph:   unreadable: {g['error']}")
    else:
        _emit(
            f"object graph:   {g['nodes']} nodes, {g['saved_values']} saved values; "
            f"root children: {', '.join(g['root_children']) or '(none)'}"
        )
    return EXIT_OK


# --- verify ----------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    from ..convert import detect_format, resolve_prefix
    from ..storage.progress import run_with_spinner

    fmt, path = detect_format(resolve_prefix(args.path))
    if getattr(args, "signature", None) is not None:
        _verify_signature(args)
    if fmt == "hf":
        return _verify_hf(path, strong=bool(getattr(args, "strong", False)))
    if fmt != "shardpoint":
        raise InvalidArgumentError(f"{path}: is a {fmt} file; verify checks shardpoint checkpoints")
    strong = bool(getattr(args, "strong", False) or getattr(args, "expect", None))
    with storage.open(path) as r:
        fi = r.format_info
        found = run_with_spinner(
            lambda: r.verify(strong=strong, expect=getattr(args, "expect", None)),
            f"verify {os.path.basename(path)}",
            progress=args.progress,
        )
        n = len(r)
    size = fi["index_bytes"] + sum(b for _, b in fi["shards"])
    _emit(f"OK {path}: {n} entries, {len(fi['shards'])} shards, {human(size)} verified")
    if found is not None:
        pinned = " (matches --expect)" if getattr(args, "expect", None) else ""
        _emit(f"strong digest OK: {found.files} shard files re-hashed; root {found}{pinned}")
    return EXIT_OK


def _verify_signature(args: argparse.Namespace) -> None:
    """``verify --signature``: the signature first (it covers every byte), then the checks."""
    from ..signing import verify_signature

    if (args.public_key is None) == (args.certificate_chain is None):
        raise InvalidArgumentError("--signature needs --public-key or --certificate-chain")
    names = verify_signature(
        args.path,
        signature=args.signature or None,
        public_key=args.public_key,
        certificate_chain=args.certificate_chain,
    )
    _emit(f"signature OK: {len(names)} files signed and unchanged")


def cmd_sign(args: argparse.Namespace) -> int:
    from ..signing import sign

    sig = sign(
        args.path,
        private_key=args.private_key,
        signature=args.signature,
        certificate=args.certificate,
        certificate_chain=args.certificate_chain or (),
        password=os.environ.get(args.password_env) if args.password_env else None,
    )
    _emit(f"signed {args.path}: {sig}")
    return EXIT_OK


def _verify_hf(path: str, strong: bool = False) -> int:
    """A Hugging Face directory has no checksums: check its structure and say so (``strong``:
    it has no digest manifest either, which raises ``DigestMissingError``)."""
    from ..convert.hf import HFReader

    r = HFReader(path)
    with r:
        r.verify(strong=strong)
        n, shards = len(r), len(r.shard_files())
    _emit(
        f"OK {path}: {n} tensors, {shards} shards, structure checked (Hugging Face safetensors "
        "has no checksums; `shardpoint convert` makes a checksummed copy)"
    )
    return EXIT_OK


def _info_hf(path: str, as_json: bool) -> int:
    from ..convert.hf import HFReader

    with HFReader(path) as r:
        fi = r.format_info
        infos = [r.info(k) for k in r.keys()]
        doc = {
            "checkpoint": path,
            "format": fi["format"],
            "index": fi["index"],
            "entries": len(infos),
            "raw_bytes": sum(i.raw_bytes for i in infos),
            "shards": [{"file": f, "bytes": n} for f, n in fi["shards"]],
            "metadata": r.metadata,
            "checksums": False,
        }
    if as_json:
        _emit(json.dumps(doc, indent=1, default=str))
        return EXIT_OK
    _emit(f"checkpoint:     {path}")
    _emit(f"format:         Hugging Face safetensors (index {doc['index'] or '(single file)'})")
    _emit(f"entries:        {doc['entries']} tensors, {human(doc['raw_bytes'])}")
    _emit(f"shards:         {len(doc['shards'])}")
    for s in doc["shards"]:
        _emit(f"  {s['file']}  {human(s['bytes'])} ({s['bytes']} bytes)")
    meta = json.dumps(doc["metadata"], sort_keys=True) if doc["metadata"] else "(none)"
    _emit(f"metadata:       {meta}")
    _emit("checksums:      none in this format (`shardpoint convert` adds them)")
    return EXIT_OK


# --- diff ------------------------------------------------------------------------------------
def cmd_diff(args: argparse.Namespace) -> int:
    from ..convert import open_source
    from ..convert.compare import diff_sources

    if args.atol < 0:
        raise InvalidArgumentError(f"--atol must be >= 0, got {args.atol}")
    if args.values:
        return _diff_values(args)
    with open_source(args.a) as a, open_source(args.b) as b:
        res = diff_sources(a, b, atol=args.atol, progress=args.progress)
    if args.json:
        doc = {
            "identical": res.identical,
            "only_a": res.only_a,
            "only_b": res.only_b,
            "differences": [d.__dict__ for d in res.differences],
            "equal": res.equal,
        }
        _emit(json.dumps(doc, indent=1, default=str))
    else:
        for k in res.only_a:
            _emit(f"only in A:  {k}")
        for k in res.only_b:
            _emit(f"only in B:  {k}")
        for d in res.differences:
            if d.what == "value" and d.max_abs is not None:
                _emit(f"values differ:  {d.key}  max |a-b| = {d.max_abs:.6g}")
            elif d.what == "value":
                _emit(f"values differ:  {d.key}  {d.a} != {d.b}")
            else:
                _emit(f"{d.what} differs:  {d.key}  {d.a} vs {d.b}")
        _emit(
            f"{len(res.equal) + len(res.differences)} common keys: {len(res.equal)} equal, "
            f"{len(res.differences)} differ; {len(res.only_a)} only in A, {len(res.only_b)} only in B"
        )
    return EXIT_OK if res.identical else EXIT_DAMAGED


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _diff_values(args: argparse.Namespace) -> int:
    """``diff --values``: how far every common tensor moved, largest relative change first."""
    from ..inspection import value_diff

    res = value_diff(args.a, args.b, keys=args.keys, progress=args.progress)
    if args.json:
        doc = {
            "identical": res.identical,
            "only_a": res.only_a,
            "only_b": res.only_b,
            "mismatched": [dict(zip(("key", "what", "a", "b"), m, strict=True)) for m in res.mismatched],
            "other_changed": res.other_changed,
            "tensors": [t.as_json() for t in res.tensors],
        }  # fmt: skip
        _emit(json.dumps(doc, indent=1))
        return EXIT_OK if res.identical else EXIT_DAMAGED
    for k in res.only_a:
        _emit(f"only in A:  {k}")
    for k in res.only_b:
        _emit(f"only in B:  {k}")
    for k, what, a, b in res.mismatched:
        _emit(f"{what} differs:  {k}  {a} vs {b}")
    for k in res.other_changed:
        _emit(f"value differs:  {k}")
    if res.tensors:
        table = [["KEY", "DTYPE", "SHAPE", "REL L2", "MAX |A-B|", "CHANGED", "SAME"]]
        for t in res.tensors:
            same = ("yes (crc)" if t.decided_by == "crc" else "yes") if t.identical else "no"
            changed = "-" if t.count < 0 else f"{t.changed}/{t.count}"
            table.append(
                [t.key, t.dtype, _shape(t.shape), _num(t.rel_l2), _num(t.max_abs), changed, same]
            )
        _emit(_table(table, right={3, 4, 5}))
    moved = sum(1 for t in res.tensors if not t.identical)
    by_crc = sum(1 for t in res.tensors if t.decided_by == "crc")
    _emit(
        f"{len(res.tensors)} common tensors: {moved} changed, {len(res.tensors) - moved} identical "
        f"({by_crc} by equal crc32c, not read); {len(res.only_a)} only in A, "
        f"{len(res.only_b)} only in B, {len(res.mismatched)} dtype/shape/kind changes"
    )
    return EXIT_OK if res.identical else EXIT_DAMAGED


# --- stats -----------------------------------------------------------------------------------
def cmd_stats(args: argparse.Namespace) -> int:
    """Per-tensor health; exit 2 when a NaN or Inf is found (unless --no-fail)."""
    from ..convert import resolve_prefix
    from ..inspection import checkpoint_stats, has_nonfinite

    path = args.path if storage.is_url(args.path) else resolve_prefix(args.path)
    stats = checkpoint_stats(path, keys=args.keys, progress=args.progress)
    bad = has_nonfinite(stats)
    if args.json:
        _emit(json.dumps({"checkpoint": path, "tensors": stats, "nonfinite": bad}, indent=1))
    else:
        if stats:
            table = [
                [
                    "KEY",
                    "DTYPE",
                    "SHAPE",
                    "MIN",
                    "MAX",
                    "MEAN",
                    "STD",
                    "L2",
                    "NAN",
                    "INF",
                    "ZEROS",
                    "",
                ]
            ]
            for k, s in stats.items():
                table.append(
                    [
                        k, s["dtype"], _shape(s["shape"]), _num(s["min"]), _num(s["max"]),
                        _num(s["mean"]), _num(s["std"]), _num(s["l2"]), str(s["nan"]),
                        str(s["posinf"] + s["neginf"]), str(s["zeros"]),
                        "NONFINITE" if k in bad else "",
                    ]
                )  # fmt: skip
            _emit(_table(table, right=set(range(3, 11))))
        _emit(f"{len(stats)} tensors, {len(bad)} with NaN/Inf")
    if bad and not args.no_fail:
        if not args.json:
            sys.stderr.write(
                f"shardpoint: {len(bad)} tensor(s) hold NaN/Inf (first: {bad[0]}); exit 2\n"
            )
        return EXIT_NONFINITE
    return EXIT_OK


# --- view ------------------------------------------------------------------------------------
def cmd_view(args: argparse.Namespace) -> int:
    """Write the self-contained HTML page of a checkpoint (and its change against B)."""
    from ..inspection.page import write_page

    out = write_page(
        args.path, args.output, other=args.other, stats=args.stats, progress=args.progress
    )
    _emit(f"wrote {out}")
    if args.open:
        import webbrowser

        webbrowser.open("file://" + os.path.abspath(out))
    return EXIT_OK


# --- convert ---------------------------------------------------------------------------------
def cmd_convert(args: argparse.Namespace) -> int:
    from ..convert import convert

    res = convert(
        args.src,
        args.dst,
        to=args.to,
        compression=args.compression,
        level=args.level,
        shards=args.shards,
        overwrite=args.force,
        durable=not args.no_fsync,
        progress=args.progress,
        max_shard_size=args.max_shard_size,
    )
    for n in res.notes:
        _note(n)
    _emit(
        f"converted {res.src_format} -> {res.dst_format}: {res.entries} entries, "
        f"{human(res.raw_bytes)} -> {args.dst}"
    )
    return EXIT_OK


# --- gc --------------------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    if not storage.is_url(args.url):
        raise InvalidArgumentError(f"{args.url}: gc cleans object-store URLs (s3://, gs://, az://)")
    n = storage.gc(args.url, older_than=float(args.older_than))
    _emit(f"aborted {n} incomplete multipart upload(s) under {args.url}")
    return EXIT_OK


# --- parsing and the error edge --------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _Fail(message, EXIT_USAGE)


def _progress_flags(p: argparse.ArgumentParser, default: Any) -> None:
    bars = p.add_mutually_exclusive_group()
    bars.add_argument(
        "--progress", dest="progress", action="store_const", const=True, default=default,
        help="always draw progress bars on stderr (default: only when stderr is a terminal)",
    )  # fmt: skip
    bars.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, default=default,
        help="never draw progress bars",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardpoint",
        description="Inspect, verify, compare and convert checkpoints.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    p.add_argument("--version", action="version", version=f"shardpoint {__version__}")
    _progress_flags(p, default=None)
    # The same flags after the command name (`shardpoint convert --progress ...`) too.
    common = _Parser(add_help=False)
    _progress_flags(common, default=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    ls = sub.add_parser(
        "ls",
        parents=[common],
        help="list keys (or a directory's checkpoints)",
        description="List the keys of a checkpoint with dtype, shape, sizes, codec and ratio, or the checkpoints of a CheckpointManager directory.",
    )
    ls.add_argument(
        "path", metavar="PREFIX", help="checkpoint prefix, .safetensors/.pt file, or directory"
    )
    ls.add_argument("--prefix", metavar="KEYPREFIX", help="only keys starting with KEYPREFIX")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_ls)

    info = sub.add_parser(
        "info",
        parents=[common],
        help="format, shards, metadata and object graph",
        description="Show format version, shards, writer metadata and the object-graph summary. A directory means its latest checkpoint.",
    )
    info.add_argument("path", metavar="PREFIX")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)

    ver = sub.add_parser(
        "verify",
        parents=[common],
        help="check every checksum (exit 1 when damaged)",
        description="Check every checksum and structural invariant in parallel. Exit 0 when intact, 1 with the damaged file, key and offset named otherwise.",
    )
    ver.add_argument("path", metavar="PREFIX")
    ver.add_argument(
        "--strong",
        action="store_true",
        help="also re-hash every file against the digest manifest recorded at save time "
        "(save with digest=...); prints the root digest (exit 1 if none was recorded)",
    )
    ver.add_argument(
        "--expect",
        metavar="ROOT",
        help="with --strong: the root digest (sha256:HEX / blake3:HEX) the checkpoint must have",
    )
    ver.add_argument(
        "--signature",
        nargs="?",
        const="",
        metavar="SIG",
        help="also check the model_signing signature SIG (default P.sig, DIR.sig); exit 1 if "
        "absent or not matching",
    )
    ver.add_argument("--public-key", metavar="PEM", help="--signature: the signer's public key")
    ver.add_argument(
        "--certificate-chain",
        metavar="PEM",
        action="append",
        help="--signature: certificates that issued the signing certificate (repeatable)",
    )
    ver.set_defaults(func=cmd_verify)

    sg = sub.add_parser(
        "sign",
        parents=[common],
        help="sign a checkpoint or model directory (model_signing, local keys)",
        description="Sign a checkpoint prefix (a manager directory: its latest checkpoint) or a Hugging Face model directory with the OpenSSF model_signing library, using a local private key (or a signing certificate). The signature verifies with `model_signing verify key` too. Needs shardpoint[signing].",
    )
    sg.add_argument("path", metavar="PREFIX")
    sg.add_argument(
        "--private-key", required=True, metavar="PEM", help="elliptic-curve private key"
    )
    sg.add_argument("--signature", metavar="SIG", help="output (default P.sig, DIR.sig)")
    sg.add_argument("--certificate", metavar="PEM", help="sign with this certificate of the key")
    sg.add_argument(
        "--certificate-chain", metavar="PEM", action="append", help="issuers of --certificate"
    )
    sg.add_argument(
        "--password-env", metavar="VAR", help="environment variable holding the key's password"
    )
    sg.set_defaults(func=cmd_sign)

    d = sub.add_parser(
        "diff",
        parents=[common],
        help="compare two checkpoints (exit 1 when they differ)",
        description="Keys only in A or B, changed dtype/shape, and the max |a-b| of differing tensors. Any readable format on either side.",
    )
    d.add_argument("a", metavar="A")
    d.add_argument("b", metavar="B")
    d.add_argument(
        "--atol",
        type=float,
        default=0.0,
        help="tensors whose max |a-b| <= ATOL count as equal (default 0: exact)",
    )
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument(
        "--values",
        action="store_true",
        help="per common tensor: relative L2 change, max |a-b|, bit-identical or not (equal "
        "crc32c: not read), sorted by change",
    )
    d.add_argument("--keys", metavar="GLOB", help="--values: only keys matching GLOB")
    d.set_defaults(func=cmd_diff)

    st = sub.add_parser(
        "stats",
        parents=[common],
        help="per-tensor min/max/mean/std, NaN/Inf/zero counts, L2 (exit 2 on NaN/Inf)",
        description="Numerical health of every tensor, computed in one parallel pass with the decode (values checksum-checked). Exit 2 when a tensor holds NaN or Inf, unless --no-fail.",
    )
    st.add_argument("path", metavar="PREFIX", help="checkpoint, HF directory or any readable file")
    st.add_argument("--keys", metavar="GLOB", help="only keys matching GLOB (fnmatch; * crosses /)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--no-fail", action="store_true", help="exit 0 even when NaN/Inf are found")
    st.set_defaults(func=cmd_stats)

    vw = sub.add_parser(
        "view",
        parents=[common],
        help="write a self-contained HTML page to browse a checkpoint (and its change vs B)",
        description="Write one self-contained, offline HTML file: the key tree with shapes, dtypes, sizes and ratios, parameters per dtype, a treemap of bytes, health statistics (NaN/Inf flagged) and, with B, the change per layer. Nothing is served.",
    )
    vw.add_argument("path", metavar="PREFIX")
    vw.add_argument("other", metavar="B", nargs="?", help="a second checkpoint to compare with")
    vw.add_argument("-o", "--output", metavar="HTML", help="output file (default ./NAME.view.html)")
    vw.add_argument(
        "--stats",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compute health statistics into the page (default: when the checkpoint is under 4 GiB)",
    )
    vw.add_argument("--open", action="store_true", help="open the page in a browser")
    vw.set_defaults(func=cmd_view)

    c = sub.add_parser(
        "convert",
        parents=[common],
        help="convert between formats",
        description="Convert SRC (shardpoint prefix, .safetensors, PyTorch .pt/.bin, TensorFlow checkpoint prefix, Hugging Face model directory) into DST: a shardpoint prefix, a .safetensors file, or (--to hf) a Hugging Face directory.",
    )
    c.add_argument("src", metavar="SRC")
    c.add_argument("dst", metavar="DST")
    c.add_argument(
        "--to",
        choices=["shardpoint", "safetensors", "hf"],
        help="destination format (default: from DST's suffix)",
    )
    c.add_argument(
        "--compression",
        default="zstd",
        choices=["zstd", "zstd-plain", "zstd-bytegroup", "bytegroup-huffman", "none"],
        help="for shardpoint destinations (default zstd)",
    )
    c.add_argument("--level", type=int, help="zstd level (-7..22)")
    c.add_argument(
        "--shards", type=int, help="shard files / writer threads (default: one per 256 MiB)"
    )
    c.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="--to hf: largest shard, e.g. 5GB, 500MB (decimal units; default 5GB)",
    )
    c.add_argument("--force", action="store_true", help="replace an existing destination")
    c.add_argument("--no-fsync", action="store_true", help="skip fsync (scratch conversions)")
    c.set_defaults(func=cmd_convert)

    g = sub.add_parser(
        "gc",
        parents=[common],
        help="abort incomplete multipart uploads of dead writers under a URL",
        description="Abort the multipart uploads that writers killed mid-save left under an object-store URL (found through their .upload marker objects), and delete the markers.",
    )
    g.add_argument("url", metavar="URL", help="s3://bucket/dir (every checkpoint below it)")
    g.add_argument(
        "--older-than",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="only uploads started at least this long ago (default 3600: spares live saves)",
    )
    g.set_defaults(func=cmd_gc)
    return p


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, (NotFoundError, FileNotFoundError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, CorruptCheckpointError):
        return EXIT_DAMAGED
    if isinstance(
        exc, (InvalidArgumentError, UnsupportedDTypeError, InvalidKeyError, MissingKeyError)
    ):
        return EXIT_USAGE
    if isinstance(exc, (CheckpointIOError, OSError)):
        return EXIT_IO
    return EXIT_DAMAGED  # any other CheckpointError is a problem with the checkpoint itself


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, CheckpointError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except _Fail as e:
        sys.stderr.write(f"shardpoint: error: {e}\n")
        return e.status
    except KeyboardInterrupt:
        sys.stderr.write("shardpoint: interrupted\n")
        return 130
    except BrokenPipeError:
        # `shardpoint ls big | head`: the reader went away; not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (CheckpointError, OSError) as e:
        sys.stderr.write(f"shardpoint: error: {_message(e)}\n")
        return _status_of(e)
    except Exception:
        traceback.print_exc()
        sys.stderr.write("shardpoint: internal error (a bug in shardpoint; please report it)\n")
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
