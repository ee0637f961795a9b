"""``shardpoint ls`` (keys, or a manager directory's checkpoints) and ``shardpoint info``."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .. import storage
from ..errors import CheckpointError, CorruptCheckpointError, InvalidArgumentError
from ..storage.paths import lost_index
from .common import _MAX_KEY_SHOWN, EXIT_OK, _emit, _note, _shape, _table, human


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
                row["bytes"] = _total_bytes(prefix, r.format_info)
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
        # data shards whose index is gone: say so (exit 3, as verify and info do), not "none"
        lost = None if storage.is_url(directory) else lost_index(directory)
        if lost is not None:
            raise lost
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
    # ``P/`` beside ``P.index`` holds hashed shards (FORMAT.md §3.1.1): a checkpoint, not a directory
    isdir = os.path.isdir(args.path) and not os.path.isfile(args.path + ".index")
    if isdir and not is_hf_path(args.path):
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
def _total_bytes(path: str, fi: dict[str, Any]) -> int:
    """What a checkpoint occupies: a single file's own size (index and data share the one
    file, so index + shard would count neither its header nor its padding), else the index
    plus every shard."""
    if not storage.is_url(path) and storage.is_single_file(path):
        return os.path.getsize(path)
    return int(fi["index_bytes"]) + sum(int(n) for _, n in fi["shards"])


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
            "total_bytes": _total_bytes(path, fi),
            "index_bytes": fi["index_bytes"],
            "chunk_bytes": fi["chunk_bytes"],
            "shards": [{"file": f, "bytes": n} for f, n in fi["shards"]],
            "metadata": r.metadata,
            "object_graph": _graph_summary(r),
        }
    from ..delta import describe

    delta = describe(path)  # {} unless a delta checkpoint (FORMAT.md §11)
    if delta:
        doc["delta"] = delta
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
    total = doc["total_bytes"]
    _emit(f"on disk:        {human(total)} ({total:,} bytes)")
    single = not storage.is_url(path) and storage.is_single_file(path)
    _emit(f"shards:         {len(doc['shards'])}" + (" (inside the single file)" if single else ""))
    for s in doc["shards"]:
        what = " in its data section" if single else ""
        _emit(f"  {s['file']}  {human(s['bytes'])} ({s['bytes']:,} bytes{what})")
    meta = json.dumps(doc["metadata"], sort_keys=True) if doc["metadata"] else "(none)"
    _emit(f"metadata:       {meta}")
    if delta:
        _emit_delta(delta)
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


def _emit_delta(d: dict[str, Any]) -> None:
    """The text form of a delta checkpoint's table: its base and each tensor's choice."""
    ts = d["tensors"]
    modes = [t["mode"] for t in ts.values()]
    _emit(
        f"delta:          against {d['base']} (depth {d['depth']}, {d['base_digest'][:19]}…); "
        f"{modes.count('same')} same, {modes.count('xor')} xor, {modes.count('full')} whole"
    )
    for key, t in ts.items():
        _emit(
            f"  {t['mode']:<5} {human(t['stored_bytes']):>10} of {human(t['raw_bytes']):>10}  {key}"
        )


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
    total = doc["total_bytes"]
    _emit(f"on disk:        {human(total)} ({total:,} bytes)")
    single = not storage.is_url(path) and storage.is_single_file(path)
    _emit(f"shards:         {len(doc['shards'])}" + (" (inside the single file)" if single else ""))
    for s in doc["shards"]:
        what = " in its data section" if single else ""
        _emit(f"  {s['file']}  {human(s['bytes'])} ({s['bytes']:,} bytes{what})")
    meta = json.dumps(doc["metadata"], sort_keys=True) if doc["metadata"] else "(none)"
    _emit(f"metadata:       {meta}")
    _emit("checksums:      none in this format (`shardpoint convert` adds them)")
    return EXIT_OK
