"""safetensors files as a conversion source (read with the ``safetensors`` package) and sink.

Opening goes through ``safetensors.safe_open(framework="numpy")``, which validates the header
(offsets contiguous, sizes matching shapes, no holes) before we touch any byte. Values are then
read with ``pread`` into fresh arrays viewed through numpy/ml_dtypes (bfloat16, float8), not
through the package's mapping: a file cut during a copy out of a mapping is a SIGBUS.

Writing is done here rather than with ``safetensors.numpy.save_file``, because that function
needs every tensor in memory at once; the layout is the same one the package writes (8-byte LE
header length, JSON header padded with spaces to a multiple of 8, tensors sorted by descending
alignment then name, densely packed), and the tests read our files back with the package.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import CorruptCheckpointError, NotFoundError
from ..storage.atomic_files import create_temp
from ..storage.dtypes import numpy_dtype, shape_problem
from ..storage.file_reads import pread_into
from ..storage.progress import progress_bar
from .base import ConvertResult, Source, Spec

__all__ = ["SafetensorsSource", "write_safetensors", "is_safetensors", "ST_TO_FORMAT"]

#: safetensors dtype tag -> shardpoint dtype name
ST_TO_FORMAT: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
FORMAT_TO_ST = {v: k for k, v in ST_TO_FORMAT.items()}
_MAX_HEADER = 100_000_000  # safetensors' own cap


def is_safetensors(path: str) -> bool:
    """Sniff: an 8-byte header length within safetensors' cap, followed by ``{``. The length is
    not checked against the file size: a truncated file is still a safetensors file (a damaged
    one, which opening reports as such), not an unknown format."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return int.from_bytes(head[:8], "little") <= _MAX_HEADER


class SafetensorsSource(Source):
    """A ``.safetensors`` file; its ``__metadata__`` becomes the checkpoint metadata."""

    format = "safetensors"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        try:
            from safetensors import safe_open
        except ImportError as e:
            raise ImportError(
                f"{path}: reading a .safetensors file needs the 'safetensors' package "
                "(pip install 'shardpoint[hf]')"
            ) from e

        try:
            # values are read from this file (the one opened, whatever the path names later),
            # and its size is checked before every read
            self._fh: Any = open(path, "rb")  # noqa: SIM115 - closed by close()
        except FileNotFoundError as e:
            raise NotFoundError(f"{path}: not found") from e
        self._size = os.fstat(self._fh.fileno()).st_size
        try:
            self._f: Any = safe_open(path, framework="numpy")
        except Exception as e:  # SafetensorError is not exported under a stable name
            self._fh.close()
            if isinstance(e, FileNotFoundError):
                raise NotFoundError(f"{path}: not found") from e
            raise CorruptCheckpointError(f"{path}: not a valid safetensors file: {e}") from e
        try:
            self._read_header()
        except BaseException:
            self._fh.close()
            raise
        finally:
            # safe_open's job ends here (the header checked as the package checks it): values
            # are read with pread on the file opened above, never through its mapping, because
            # a truncation landing during a copy out of a mapping kills the process with
            # SIGBUS, whatever size check came before the copy; pread returns short instead.
            self._f = None

    def _read_header(self) -> None:
        path = self.path
        self.metadata = dict(self._f.metadata() or {})
        self._specs: list[Spec] = []
        for key in self._f.keys():
            sl = self._f.get_slice(key)
            tag, shape = sl.get_dtype(), tuple(int(d) for d in sl.get_shape())
            name = ST_TO_FORMAT.get(tag)
            if name is None:
                self.notes.append(f"skipped {key!r}: safetensors dtype {tag} not supported")
                continue
            # numpy_dtype also imports ml_dtypes: safe_open(framework="numpy") needs it for bf16
            problem = shape_problem(shape, 8 * numpy_dtype(name).itemsize)
            if problem is not None:
                raise CorruptCheckpointError(
                    f"{path}: key {key!r}: shape {list(shape)} of {tag} cannot be represented: "
                    f"{problem}"
                )
            nbytes = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(name).itemsize
            self._specs.append(Spec(key, name, shape, nbytes))
        self._by_key = {s.key: s for s in self._specs}
        self._ranges = self._data_ranges()

    def specs(self) -> list[Spec]:
        return list(self._specs)

    def _data_ranges(self) -> dict[str, tuple[int, int]]:
        """Each supported key's absolute byte range, from the header of the file held open
        (safe_open validated the header of the file the path named; both are checked against
        the specs, so a file swapped in between is refused, not misread)."""
        fd = self._fh.fileno()
        n = int.from_bytes(os.pread(fd, 8, 0), "little")
        blob = os.pread(fd, min(n, _MAX_HEADER), 8) if n <= _MAX_HEADER else b""
        try:
            header = json.loads(blob)
        except (ValueError, RecursionError):
            header = None
        ranges: dict[str, tuple[int, int]] = {}
        for spec in self._specs:  # (a hostile header cannot get here: safe_open refused it)
            entry = header.get(spec.key) if isinstance(header, dict) else None
            offs = entry.get("data_offsets") if isinstance(entry, dict) else None
            begin, end = 0, -1
            if isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs):
                begin, end = 8 + n + offs[0], 8 + n + offs[1]
            if end - begin != spec.nbytes or begin < 8 + n or end > self._size:
                raise CorruptCheckpointError(
                    f"{self.path}: key {spec.key!r}: the file changed while it was opened "
                    "(its header no longer matches the one validated)"
                )
            ranges[spec.key] = (begin, end)
        return ranges

    def _shrunk(self, key: str) -> CorruptCheckpointError:
        now = os.fstat(self._fh.fileno()).st_size
        return CorruptCheckpointError(
            f"{self.path}: key {key!r}: file is now {now} bytes, {self._size} when opened: "
            "it was truncated or rewritten in place while being read"
        )

    def read(self, key: str) -> Any:
        spec = self._by_key[key]
        # A file already shorter than at open is damaged: refuse every read, not only those
        # whose bytes happen to be past the new end.
        if os.fstat(self._fh.fileno()).st_size < self._size:
            raise self._shrunk(key)
        begin, end = self._ranges[key]
        out = np.empty(end - begin, dtype=np.uint8)
        if pread_into(self._fh.fileno(), out.data, begin) < len(out):
            raise self._shrunk(key)
        return out.view(numpy_dtype(spec.dtype)).reshape(spec.shape)

    def close(self) -> None:
        self._fh.close()


def _st_metadata(metadata: dict[str, Any]) -> dict[str, str] | None:
    """safetensors metadata is str -> str only: other values are stored as JSON text."""
    if not metadata:
        return None
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}


def write_safetensors(
    source: Source, dst: str, *, durable: bool = True, progress: bool | None = None
) -> ConvertResult:
    """Stream the tensors of ``source`` into a new safetensors file ``dst`` (atomically).

    Non-tensor values and dtypes safetensors has no tag for (complex128) are skipped with a note.
    """
    result = ConvertResult(source.format, "safetensors", notes=list(source.notes))
    specs = []
    for s in source.specs():
        if s.kind != "tensor":
            result.notes.append(
                f"skipped {s.key!r}: {s.kind} value (safetensors holds tensors only)"
            )
        elif s.dtype not in FORMAT_TO_ST:
            result.notes.append(f"skipped {s.key!r}: dtype {s.dtype} has no safetensors tag")
        else:
            specs.append(s)
    # The package's own order: larger alignment first, then by name, so every tensor is aligned.
    specs.sort(key=lambda s: (-numpy_dtype(s.dtype).itemsize, s.key))
    header: dict[str, Any] = {}
    meta = _st_metadata(source.metadata)
    if meta:
        header["__metadata__"] = meta
    pos = 0
    for s in specs:
        header[s.key] = {
            "dtype": FORMAT_TO_ST[s.dtype],
            "shape": list(s.shape),
            "data_offsets": [pos, pos + s.nbytes],
        }
        pos += s.nbytes
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    directory = os.path.dirname(os.path.abspath(dst))
    # mode 0666 minus the umask like any file a user writes (mkstemp would make it 0600)
    fd, tmp = create_temp(directory, os.path.basename(dst) + ".", ".tmp")
    bar = progress_bar(pos, f"convert {os.path.basename(dst)}", progress=progress)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for s in specs:
                arr = _checked(np.asarray(source.read(s.key)), s)
                f.write(arr.reshape(-1).view(np.uint8).data)
                result.entries += 1
                result.raw_bytes += s.nbytes
                bar.update(s.nbytes)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        bar.close()
    return result


def _checked(arr: np.ndarray, spec: Spec) -> np.ndarray:
    """``arr`` as contiguous little-endian bytes of exactly the advertised dtype and shape."""
    want = numpy_dtype(spec.dtype)
    if arr.dtype.newbyteorder("<") != want or arr.shape != spec.shape:
        raise CorruptCheckpointError(
            f"key {spec.key!r}: read {arr.dtype}{list(arr.shape)}, "
            f"index says {spec.dtype}{list(spec.shape)}"
        )
    if arr.dtype.byteorder == ">":
        arr = arr.astype(want)
    return np.ascontiguousarray(arr)
