"""The non-weight files of a Hugging Face model directory, kept with a converted checkpoint.

``shardpoint convert DIR P`` stores ``config.json``, ``generation_config.json``, the tokenizer
files, ``README.md``... in the checkpoint's ``shardpoint.hf`` metadata section (FORMAT.md §7;
covered by the index checksum, parsed only when asked for), and ``sp.export_hf`` /
``convert --to hf`` write them back beside the weights, so ``from_pretrained`` loads the
result. Layout of the section (docs/HF.md)::

    {"version": 1, "files": [{"name": "config.json", "encoding": "utf-8", "data": "..."},
                             {"name": "tokenizer.model", "encoding": "base64", "data": "..."}]}

Weights in any format, hidden files and files over the size caps are not kept (each skipped
file is listed in the conversion's notes). Names read back are hostile input: only relative
paths without ``..``, hidden or empty components are written, and never over the weights.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any

from ..errors import CorruptCheckpointError

__all__ = [
    "SECTION",
    "collect_files",
    "write_files",
    "with_dtype",
    "MAX_FILE_BYTES",
    "MAX_TOTAL_BYTES",
]

SECTION = "shardpoint.hf"
_VERSION = 1
#: One kept file at most (tokenizer.json of large vocabularies is ~10-35 MB).
MAX_FILE_BYTES = 64 << 20
#: All kept files together: they live in the index's metadata.
MAX_TOTAL_BYTES = 128 << 20
_MAX_FILES = 1000
# Weights (in this or another format) are the checkpoint itself or not converted: not kept.
_WEIGHT_SUFFIXES = (
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".msgpack.index.json",
    ".onnx",
    ".gguf",
    ".index",
)


def _is_weights(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES) or ".data-" in os.path.basename(name)


def collect_files(directory: str, notes: list[str]) -> dict[str, Any] | None:
    """The section for the other files of HF ``directory`` (``None`` if there are none);
    skipped files are explained in ``notes``."""
    found: list[dict[str, str]] = []
    total = 0
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for fname in sorted(names):
            path = os.path.join(root, fname)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if fname.startswith(".") or _is_weights(rel) or not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            if size > MAX_FILE_BYTES or total + size > MAX_TOTAL_BYTES or len(found) >= _MAX_FILES:
                notes.append(
                    f"not kept: {rel} ({size} bytes; the files kept with a checkpoint are "
                    f"capped at {MAX_FILE_BYTES} bytes each, {MAX_TOTAL_BYTES} in all)"
                )
                continue
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            total += len(raw)
            try:
                found.append({"name": rel, "encoding": "utf-8", "data": raw.decode("utf-8")})
            except UnicodeDecodeError:
                found.append(
                    {"name": rel, "encoding": "base64", "data": base64.b64encode(raw).decode()}
                )
    if not found:
        return None
    return {"version": _VERSION, "files": found}


def _safe_name(name: Any, where: str) -> str:
    bad = (
        not isinstance(name, str)
        or not name
        or len(name) > 1024
        or "\\" in name
        or "\0" in name
        or name.startswith("/")
        or any(part in ("", ".", "..") or part.startswith(".") for part in name.split("/"))
    )
    if bad:
        raise CorruptCheckpointError(f"{where}: kept file name {str(name)[:80]!r} is not allowed")
    return str(name)


def write_files(
    section: Mapping[str, Any] | None,
    out_dir: str,
    *,
    taken: set[str],
    where: str,
    durable: bool,
    notes: list[str],
) -> int:
    """Write the files of ``section`` into ``out_dir`` (a fresh directory), never over a name in
    ``taken`` (the weights just written); returns how many. ``where`` names the checkpoint in
    errors: a malformed section raises ``CorruptCheckpointError``."""
    if not section:
        return 0
    if not isinstance(section, Mapping) or not isinstance(section.get("files"), list):
        raise CorruptCheckpointError(f"{where}: the {SECTION} section is malformed")
    if not isinstance(section.get("version"), int) or section["version"] > _VERSION:
        raise CorruptCheckpointError(
            f"{where}: {SECTION} section version {section.get('version')!r} is not supported"
        )
    written = 0
    for item in section["files"]:
        if not isinstance(item, Mapping) or not isinstance(item.get("data"), str):
            raise CorruptCheckpointError(f"{where}: a kept file record is malformed")
        name = _safe_name(item.get("name"), where)
        if name in taken:
            notes.append(f"not written: kept file {name} would replace the exported weights")
            continue
        encoding = item.get("encoding")
        if encoding == "utf-8":
            raw = item["data"].encode("utf-8")
        elif encoding == "base64":
            try:
                raw = base64.b64decode(item["data"], validate=True)
            except ValueError as e:
                raise CorruptCheckpointError(f"{where}: kept file {name}: bad base64: {e}") from e
        else:
            raise CorruptCheckpointError(f"{where}: kept file {name}: unknown encoding")
        path = os.path.join(out_dir, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            f = open(path, "xb")  # x: a name given twice is refused, not overwritten
        except FileExistsError:
            raise CorruptCheckpointError(f"{where}: kept file {name} is listed twice") from None
        with f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        taken.add(name)
        written += 1
    return written


def with_dtype(section: Mapping[str, Any] | None, dtype: str | None) -> Mapping[str, Any] | None:
    """``section`` (kept files) whose config.json says ``dtype`` (set from ``torch_dtype``, or
    from the weights, when absent). Unchanged when there is no JSON-object config.json."""
    if not section or dtype is None or not isinstance(section.get("files"), list):
        return section
    out = []
    for item in section["files"]:
        if isinstance(item, Mapping) and item.get("name") == "config.json":
            try:
                cfg = json.loads(item["data"]) if item.get("encoding") == "utf-8" else None
            except (TypeError, ValueError):
                cfg = None
            if isinstance(cfg, dict) and "dtype" not in cfg:
                cfg["dtype"] = cfg.get("torch_dtype") or dtype
                item = {**item, "data": json.dumps(cfg, indent=2, sort_keys=True) + "\n"}
        out.append(item)
    return {**section, "files": out}
